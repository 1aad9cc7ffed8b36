#!/usr/bin/env bash
# Per thread and per round trip: context switches, CPU migrations and syscalls of retry-bench's
# cases, in both harness modes, to show whether criterion and `RETRY_BENCH_PROFILE` run a case the
# same way (issue 9; docs/benchmarks.md, "Deciding one in flight").
#
# Each case runs in each mode for a while; `perf stat --per-thread` attaches to the running process
# for SECONDS and counts per thread; the round trips in that window are the client side's `sendto`
# calls (every thread but the servers'). Modes:
#   criterion  one long criterion run of the case (`--measurement-time` MEASURE), the window
#              inside its measurement (criterion's samples, spawns and the bench thread's wakes
#              between samples included);
#   profile    RETRY_BENCH_PROFILE with a count it never reaches, the window after its warm-up.
#
#   scripts/bench-adapters-harness.sh                   # echo, tokio, async-std, mongodb; canned; 1 in flight
#   CASES="tokio mongodb" MODES=profile IN_FLIGHT=64 SERVER=testkit scripts/bench-adapters-harness.sh
#   PIN=0 CASES="echo-async-io async-std" MODES=profile scripts/bench-adapters-harness.sh
#                                                       # the whole process on CPU 0 (taskset)
#
# Needs `perf` with tracepoints (root). BENCH_BIN as scripts/bench-adapters-profile.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

CASES=${CASES:-"echo tokio async-std mongodb"}
MODES=${MODES:-"criterion profile"}
IN_FLIGHT=${IN_FLIGHT:-1}
SERVER=${SERVER:-canned}
SECONDS_COUNTED=${SECONDS_COUNTED:-4}
MEASURE=${MEASURE:-12}
OUT=${OUT:-target/bench-adapters-harness}
mkdir -p "$OUT"

. scripts/bench-bin.sh
echo "bench binary: $BENCH_BIN; start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" \
    "pin=${PIN:-none}"
# PIN=<cpus>: the whole bench process under `taskset -c` (as bench-adapters-interleaved.sh).
run=("$BENCH_BIN")
if [ -n "${PIN:-}" ]; then run=(taskset -c "$PIN" "$BENCH_BIN"); fi

EVENTS=context-switches,cpu-migrations,task-clock,raw_syscalls:sys_enter
EVENTS=$EVENTS,syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_wait
EVENTS=$EVENTS,syscalls:sys_enter_futex,syscalls:sys_enter_write,syscalls:sys_enter_read
EVENTS=$EVENTS,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_epoll_ctl

criterion_name() {
    case $1 in
        echo) echo "raw TCP echo" ;;
        tokio) echo "retry-tokio, $SERVER server" ;;
        async-std) echo "retry-async-std, $SERVER server" ;;
        mongodb) echo "mongodb crate, $SERVER server" ;;
        *) echo "no criterion case for $1" >&2; exit 1 ;;
    esac
}

for case in $CASES; do
    for mode in $MODES; do
        file="$OUT/$case-$mode-$IN_FLIGHT-$SERVER"
        if [ "$mode" = criterion ]; then
            RETRY_BENCH_RATIOS=0 CRITERION_HOME="$OUT/criterion" "${run[@]}" --bench --noplot \
                --warm-up-time 1 --measurement-time "$MEASURE" \
                "^ping_round_trip_concurrency_$IN_FLIGHT/$(criterion_name "$case")\$" >"$file.out" 2>&1 &
            delay=4
        else
            RETRY_BENCH_PROFILE="$case $IN_FLIGHT 1000000000 $SERVER" "${run[@]}" >"$file.out" 2>&1 &
            delay=3
        fi
        pid=$!
        sleep "$delay"
        perf stat --per-thread -x ';' -o "$file.perf" -e "$EVENTS" -p "$pid" -- sleep "$SECONDS_COUNTED" \
            >/dev/null 2>&1 || true
        if [ "$mode" = criterion ]; then
            wait "$pid" || true
        else
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
        python3 - "$file" "$case" "$mode" "$SECONDS_COUNTED" <<'EOF'
import collections, re, sys

path, case, mode, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
threads = collections.defaultdict(collections.Counter)
for line in open(path + ".perf"):
    parts = line.strip().split(";")
    if len(parts) < 4 or not parts[1].replace(".", "").isdigit():
        continue
    comm, event = parts[0], parts[3].split(":")[-1]
    threads[comm][event] += float(parts[1])
def role(comm):
    return "server" if comm.startswith("bench-server") else "client"
round_trips = sum(c["sys_enter_sendto"] for t, c in threads.items() if role(t) == "client") or 1
total = collections.Counter()
for c in threads.values():
    total.update(c)
criterion = ""
for line in open(path + ".out", errors="replace"):
    m = re.search(r"time:\s+\[\S+ \S+ (\S+ \S+) ", line)
    if m:
        criterion = f" criterion_estimate={m.group(1)}"
print(f"case={case} mode={mode} round_trips={round_trips:.0f} in {seconds:.0f}s "
      f"us_per_round_trip={seconds * 1e6 / round_trips:.1f}{criterion}")
def show(name, c):
    per = lambda e: c[e] / round_trips
    print(f"  {name:28} switches={per('context-switches'):.3f} migrations={per('cpu-migrations'):.3f} "
          f"cpu_us={c['task-clock'] * 1e3 / round_trips:.1f} syscalls={per('sys_enter'):.2f} "
          f"sendto={per('sys_enter_sendto'):.2f} recvfrom={per('sys_enter_recvfrom'):.2f} "
          f"epoll_wait={per('sys_enter_epoll_wait'):.2f} futex={per('sys_enter_futex'):.2f} "
          f"write={per('sys_enter_write'):.2f} read={per('sys_enter_read'):.2f} "
          f"epoll_pwait={per('sys_enter_epoll_pwait'):.2f} epoll_ctl={per('sys_enter_epoll_ctl'):.2f}")
show("all threads", total)
for comm, c in sorted(threads.items(), key=lambda kv: -kv[1]["context-switches"]):
    if c["context-switches"] / round_trips >= 0.005 or c["sys_enter"] / round_trips >= 0.05:
        show(comm, c)
EOF
    done
done
