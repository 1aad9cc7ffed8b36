#!/usr/bin/env bash
# Issue 9's adapter ratios at one in flight (or 64), decided from interleaved short runs instead of
# one long run per case. See docs/benchmarks.md, "Deciding one in flight".
#
# Four cases of retry-bench's round_trip bench on one server: the raw TCP echo, retry-tokio,
# retry-async-std and the official mongodb crate. The ratios of a round come from that round's four
# figures, measured in the same seconds, so a change of the machine's state between rounds moves
# all four together; the median and the spread over the rounds say whether a goal is met or
# whether the machine cannot tell. Two modes:
#   MODE=criterion (default)  every round is one short criterion run of the group filtered to the
#       four cases (criterion runs them in that order: A B C D, then the next round: A B C D, ...);
#       a figure is criterion's slope estimate, the number the other sections quote;
#   MODE=blocks  one process (RETRY_BENCH_INTERLEAVED): every round is BLOCKS blocks of PER_BLOCK
#       round trips of each case, the order rotating from block to block (ABCDE, BCDEA, ...), so a
#       state lasting longer than a block falls on every case alike; a figure is the case's wall
#       time over the round's blocks divided by its round trips. A fifth case, the echo with
#       async-io's callers on the bench's thread (echo-async-io), gives one more ratio without a
#       goal: retry-async-std against its own runtime's limit. Also per case and round trip: the
#       machine's cpuidle entries (on this VM a halted vCPU, whose wake-up costs ~30 us), the
#       bench threads' migrations and context switches (medians printed at the end).
#       Defaults: one in flight PER_BLOCK=20000 BLOCKS=1 (a round ~2-6 s), 64 in flight
#       PER_BLOCK=20000 BLOCKS=10.
#
# Where the threads run (docs/benchmarks.md, "One in flight: what is measured"):
#   PIN=<cpus>   the whole bench process under `taskset -c <cpus>` (e.g. PIN=0: every thread, the
#       servers' included, on one CPU). At one in flight this is the figure of the clients' own
#       work: no round trip waits for a halted vCPU to wake (the decision of the twelfth session:
#       issue 9's one-in-flight goals are read pinned, the unpinned run reported beside it).
#   CPUS="server=<cpus> client=<cpus> bench=<cpus>"  (RETRY_BENCH_CPUS) each role's threads on
#       its own CPUs: e.g. server=1 client=0 bench=0 puts every wake between client and server
#       across vCPUs, to measure that wake's cost apart from the clients'. A role left out is
#       not pinned and inherits the bench thread's CPUs (the runtimes are started from it):
#       bench=0 alone puts every thread on CPU 0, bench=0 server=1 leaves the clients on 0.
#
#   SPIN=1       a busy loop at `nice -n 19` on every CPU for the run (children of this script, so
#       in the bench's session and autogroup: they yield to the bench's threads): no vCPU halts,
#       so a wake across vCPUs costs an interrupt and a preemption, not the host's halt exit and
#       re-entry; two CPUs without halting, as a bare-metal machine or a polling guest idles.
#
#   MODE=blocks PIN=0 scripts/bench-adapters-interleaved.sh        # one in flight, the goals' figure
#   MODE=blocks scripts/bench-adapters-interleaved.sh              # one in flight, unpinned, beside it
#   MODE=blocks IN_FLIGHT=64 ROUNDS=6 scripts/bench-adapters-interleaved.sh
#   scripts/bench-adapters-interleaved.sh               # 8 criterion rounds, one in flight, canned
#   ROUNDS=12 IN_FLIGHT=64 SERVER=testkit scripts/bench-adapters-interleaved.sh
#   BENCH_BIN=target/release/deps/round_trip-<hash> WARM_UP=1 MEASURE=3 scripts/bench-adapters-interleaved.sh
#
# Needs the bench built with the official driver (`--features mongodb`); builds it when BENCH_BIN
# is not given. Meant for an idle machine: on a loaded one the spread says so.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-8}
IN_FLIGHT=${IN_FLIGHT:-1}
SERVER=${SERVER:-canned}
WARM_UP=${WARM_UP:-0.5}
MEASURE=${MEASURE:-1.5}
OUT=${OUT:-target/bench-adapters-interleaved}
mkdir -p "$OUT"

. scripts/bench-bin.sh
echo "bench binary: $BENCH_BIN"
# PIN: the whole process on those CPUs; CPUS: each role's threads on its own (see above).
run=("$BENCH_BIN")
if [ -n "${PIN:-}" ]; then run=(taskset -c "$PIN" "$BENCH_BIN"); fi
if [ -n "${CPUS:-}" ]; then export RETRY_BENCH_CPUS="$CPUS"; fi
echo "pin=${PIN:-none} cpus=${CPUS:-any} spin=${SPIN:-0}"
spinners=()
stop_spinners() {
    for pid in "${spinners[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap stop_spinners EXIT
if [ "${SPIN:-0}" = 1 ]; then
    for cpu in $(seq 0 $(($(nproc) - 1))); do
        nice -n 19 taskset -c "$cpu" sh -c 'while :; do :; done' &
        spinners+=("$!")
    done
fi

# The machine's idle share since `cpu_start` (from /proc/stat): other sessions' processes may not be
# visible here, their CPU time is. On an idle machine the only busy time is the bench's own.
cpu_idle() {
    python3 - "$1" "$(head -1 /proc/stat)" <<'PY'
import sys
a, b = ([int(x) for x in line.split()[1:]] for line in sys.argv[1:3])
d = [y - x for x, y in zip(a, b)]
print(f"cpu_idle={100 * (d[3] + d[4]) / max(sum(d), 1):.0f}% cpu_nice={100 * d[1] / max(sum(d), 1):.0f}%")
PY
}
cpu_start=$(head -1 /proc/stat)
echo "rounds=$ROUNDS in_flight=$IN_FLIGHT server=$SERVER warm_up=${WARM_UP}s measure=${MEASURE}s" \
    "start=$(date -u +%H:%M:%S) load=$(cut -d' ' -f1-3 /proc/loadavg)"

MODE=${MODE:-criterion}
if [ "$MODE" = blocks ]; then
    # One in flight: long blocks (1,000 round trips per block gave the official driver 75-100 us
    # against 70-73 with 20,000 on the idle VM, unpinned: thread placement, not the client; see
    # docs/benchmarks.md, "One in flight: what is measured").
    if [ "$IN_FLIGHT" = 1 ]; then
        PER_BLOCK=${PER_BLOCK:-20000}; BLOCKS=${BLOCKS:-1}
    else
        PER_BLOCK=${PER_BLOCK:-20000}; BLOCKS=${BLOCKS:-10}
    fi
    echo "mode=blocks blocks=$BLOCKS per_block=$PER_BLOCK"
    RETRY_BENCH_INTERLEAVED="$IN_FLIGHT $SERVER $ROUNDS $BLOCKS $PER_BLOCK echo tokio async-std mongodb echo-async-io" \
        "${run[@]}" | tee "$OUT/blocks.txt"
else
    filter="^ping_round_trip_concurrency_$IN_FLIGHT/(raw TCP echo|retry-tokio, $SERVER server|retry-async-std, $SERVER server|mongodb crate, $SERVER server)\$"
    for round in $(seq 1 "$ROUNDS"); do
        round_start=$(head -1 /proc/stat)
        # RETRY_BENCH_RATIOS=0: no interleaved rounds of every case after the criterion run.
        RETRY_BENCH_RATIOS=0 CRITERION_HOME="$OUT/criterion" "${run[@]}" --bench --noplot \
            --warm-up-time "$WARM_UP" --measurement-time "$MEASURE" "$filter" \
            >"$OUT/round.$round.txt" 2>"$OUT/round.$round.err"
        echo "round $round done $(date -u +%H:%M:%S) load=$(cut -d' ' -f1 /proc/loadavg)" \
            "$(cpu_idle "$round_start")"
    done
fi

python3 - "$OUT" "$ROUNDS" "$MODE" <<'EOF'
import re, statistics, sys

out, rounds, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
unit = {"ps": 1e-3, "ns": 1.0, "us": 1e3, "\u00b5s": 1e3, "\u03bcs": 1e3, "ms": 1e6, "s": 1e9}
time = re.compile(r"time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]")
cases = {"raw TCP echo": "echo", "retry-tokio,": "tokio", "retry-async-std,": "async-std",
         "mongodb crate,": "mongodb"}
# (name, numerator, denominator, goal, the goal's direction)
ratios = [("tokio/echo", "tokio", "echo", 1.25, "<="),
          ("async-std/echo", "async-std", "echo", 1.25, "<="),
          ("async-std/tokio", "async-std", "tokio", 1.2, "<="),
          ("tokio throughput x official", "mongodb", "tokio", 1.3, ">=")]
if mode == "blocks":
    # No goal: retry-async-std against the same echo with async-io's callers on the bench's thread
    # (its runtime's own limit), to tell the adapter's share from async-io's.
    ratios.append(("async-std/echo-async-io", "async-std", "echo-async-io", None, ""))
rows, counts = [], {}
if mode == "blocks":
    for line in open(f"{out}/blocks.txt"):
        if line.startswith("round="):
            fields = dict(w.split("=", 1) for w in line.split())
            rows.append({c: float(v) for c, v in fields.items() if c not in ("round", "in_flight", "server")})
        elif line.startswith("counts="):
            for word in line.split()[2:]:
                case, values = word.split("=", 1)
                counts.setdefault(case, []).append([float(v) for v in values.split("/")])
for r in range(1, rounds + 1 if mode == "criterion" else 0):
    ns, case = {}, None
    for line in open(f"{out}/round.{r}.txt", errors="replace"):
        if line.startswith("ping_round_trip_concurrency_"):
            name = line.split("/", 1)[1]
            case = next((c for k, c in cases.items() if name.startswith(k)), None)
        m = time.search(line)
        if m and case:
            ns[case] = float(m.group(1)) * unit[m.group(2)]
            case = None
    if len(ns) < 4:
        print(f"round {r}: only {sorted(ns)} measured, skipped (see {out}/round.{r}.err)")
        continue
    rows.append(ns)
columns = ["echo", "tokio", "async-std", "mongodb"] + (["echo-async-io"] if mode == "blocks" else [])
print("round  " + "  ".join(f"{c}_us" for c in columns) + "  " + "  ".join(n for n, *_ in ratios))
for r, ns in enumerate(rows, 1):
    times = "  ".join(f"{ns[c] / 1e3:{len(c) + 3}.1f}" for c in columns)
    print(f"{r:5}  {times}  " + "  ".join(f"{ns[a] / ns[b]:{len(n)}.3f}" for n, a, b, *_ in ratios))
if not rows:
    sys.exit(1)
for case, values in counts.items():
    medians = [statistics.median(v[k] for v in values) for k in range(3)]
    print(f"{case} per round trip (median over rounds): cpuidle entries {medians[0]:.3f}, "
          f"migrations {medians[1]:.3f}, context switches {medians[2]:.3f}")
for name, a, b, goal, sense in ratios:
    values = sorted(ns[a] / ns[b] for ns in rows)
    line = (f"{name}: median {statistics.median(values):.3f}, min {values[0]:.3f}, "
            f"max {values[-1]:.3f} over {len(values)} rounds")
    if goal is not None:
        met = sum(v <= goal if sense == "<=" else v >= goal for v in values)
        line += f"; goal {sense} {goal}: met in {met} of {len(values)}"
    print(line)
EOF
echo "end=$(date -u +%H:%M:%S) load=$(cut -d' ' -f1-3 /proc/loadavg) over the run: $(cpu_idle "$cpu_start")"
