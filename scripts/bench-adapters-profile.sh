#!/usr/bin/env bash
# Instructions, syscalls and futex wake-ups per ping round trip of retry-bench's cases (issue 9),
# split into client side (adapter, engine + codec, runtime, allocator) and server side, on
# stable counts instead of wall-clock time. See docs/benchmarks.md, retry-bench section.
#
# Each case runs twice under `valgrind --tool=callgrind --separate-threads=yes` and twice under
# `strace -f`, with N1 and N2 round trips (RETRY_BENCH_PROFILE, after the same setup and warm-up);
# the difference divided by N2 - N1 is the cost of one round trip, setup excluded.
#
#   scripts/bench-adapters-profile.sh                   # every case, both servers, 1 and 64 in flight
#   CASES="tokio" SERVERS=canned IN_FLIGHT=1 scripts/bench-adapters-profile.sh
#   TOP=30 N2=11000 BENCH_BIN=target/release/deps/round_trip-<hash> scripts/bench-adapters-profile.sh
#                                                       # and the client's 30 costliest functions
#
#   SCHED=1 CASES="echo tokio mongodb" SERVERS=canned IN_FLIGHT=1 scripts/bench-adapters-profile.sh
#                                                       # and per round trip: thread wakes, wakes
#                                                       # of a halted CPU, CPU idle entries, blocks
#                                                       # (perf sched tracepoints, system-wide)
#
# Installs valgrind and strace with apt-get when they are missing (perf for SCHED=1 is not).
set -euo pipefail
cd "$(dirname "$0")/.."

need() {
    command -v "$1" >/dev/null 2>&1 || {
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
    }
}
need valgrind valgrind
need strace strace
need python3 python3

CASES=${CASES:-"echo tokio async-std mongodb"}
SERVERS=${SERVERS:-"testkit canned"}
IN_FLIGHT=${IN_FLIGHT:-"1 64"}
N1=${N1:-1000}
N2=${N2:-3000}
OUT=${OUT:-target/bench-adapters-profile}
mkdir -p "$OUT"

. scripts/bench-bin.sh
echo "bench binary: $BENCH_BIN"

for case in $CASES; do
    servers=$SERVERS
    case $case in echo*) servers=testkit ;; esac
    for server in $servers; do
        for k in $IN_FLIGHT; do
            dir="$OUT/$case-$server-$k"
            rm -rf "$dir" && mkdir -p "$dir"
            for n in "$N1" "$N2"; do
                RETRY_BENCH_PROFILE="$case $k $n $server" valgrind --tool=callgrind \
                    --separate-threads=yes --callgrind-out-file="$dir/callgrind.$n" \
                    "$BENCH_BIN" >"$dir/out.$n" 2>"$dir/valgrind.$n.log" || true
                RETRY_BENCH_PROFILE="$case $k $n $server" strace -f -qq -yy \
                    -o "$dir/strace.$n" "$BENCH_BIN" >/dev/null 2>&1 || true
            done
            python3 scripts/bench-adapters-profile.py "$dir" "$N1" "$N2" \
                "case=$case server=$server in_flight=$k"
            if [ -n "${SCHED:-}" ]; then
                # Who wakes whom, and how often a wake finds its CPU halted: 1 s of scheduler
                # events of a long run (system-wide: only meaningful on an otherwise idle machine).
                RETRY_BENCH_PROFILE="$case $k 1000000000 $server" "$BENCH_BIN" >/dev/null 2>&1 &
                pid=$!
                sleep 3
                perf record -q -o "$dir/sched.data" -e sched:sched_switch -e sched:sched_waking \
                    -e power:cpu_idle -e syscalls:sys_enter_sendto -a -- sleep 1 >/dev/null 2>&1 || true
                kill "$pid" 2>/dev/null || true
                wait "$pid" 2>/dev/null || true
                perf script -i "$dir/sched.data" 2>/dev/null |
                    python3 scripts/bench-adapters-profile.py --sched "case=$case server=$server in_flight=$k"
            fi
        done
    done
done
