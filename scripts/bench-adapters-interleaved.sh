#!/usr/bin/env bash
# Issue 9's adapter ratios at one in flight (or 64), decided from interleaved short criterion runs
# instead of one long run per case. See docs/benchmarks.md, "Deciding one in flight".
#
# Every round is one short run of retry-bench's round_trip bench, filtered to four cases of one
# group: the raw TCP echo, retry-tokio, retry-async-std and the official mongodb crate on one
# server (criterion runs them in that order: A B C D, then the next round: A B C D, ...). The
# ratios of a round come from that round's four estimates (criterion's slope, minutes apart at
# most), so a change of the machine's state between rounds moves all four together; the median
# and the spread over the rounds say whether a goal is met or whether the machine cannot tell.
#
#   scripts/bench-adapters-interleaved.sh               # 8 rounds, one in flight, canned server
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

if [ -z "${BENCH_BIN:-}" ]; then
    BENCH_BIN=$(cargo bench -p retry-bench --features mongodb --bench round_trip --no-run \
        --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "round_trip":
        print(m["executable"])')
fi
echo "bench binary: $BENCH_BIN"
echo "rounds=$ROUNDS in_flight=$IN_FLIGHT server=$SERVER warm_up=${WARM_UP}s measure=${MEASURE}s" \
    "start=$(date -u +%H:%M:%S) load=$(cut -d' ' -f1-3 /proc/loadavg)"

filter="^ping_round_trip_concurrency_$IN_FLIGHT/(raw TCP echo|retry-tokio, $SERVER server|retry-async-std, $SERVER server|mongodb crate, $SERVER server)\$"
for round in $(seq 1 "$ROUNDS"); do
    # RETRY_BENCH_RATIOS=0: no interleaved rounds of every case after the criterion run.
    RETRY_BENCH_RATIOS=0 CRITERION_HOME="$OUT/criterion" "$BENCH_BIN" --bench --noplot \
        --warm-up-time "$WARM_UP" --measurement-time "$MEASURE" "$filter" \
        >"$OUT/round.$round.txt" 2>"$OUT/round.$round.err"
    echo "round $round done $(date -u +%H:%M:%S) load=$(cut -d' ' -f1 /proc/loadavg)"
done

python3 - "$OUT" "$ROUNDS" <<'EOF'
import re, statistics, sys

out, rounds = sys.argv[1], int(sys.argv[2])
unit = {"ps": 1e-3, "ns": 1.0, "us": 1e3, "\u00b5s": 1e3, "\u03bcs": 1e3, "ms": 1e6, "s": 1e9}
time = re.compile(r"time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]")
cases = {"raw TCP echo": "echo", "retry-tokio,": "tokio", "retry-async-std,": "async-std",
         "mongodb crate,": "mongodb"}
# (name, numerator, denominator, goal, the goal's direction)
ratios = [("tokio/echo", "tokio", "echo", 1.25, "<="),
          ("async-std/echo", "async-std", "echo", 1.25, "<="),
          ("async-std/tokio", "async-std", "tokio", 1.2, "<="),
          ("tokio throughput x official", "mongodb", "tokio", 1.3, ">=")]
rows = []
for r in range(1, rounds + 1):
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
print("round  echo_us  tokio_us  async-std_us  mongodb_us  " + "  ".join(n for n, *_ in ratios))
for r, ns in enumerate(rows, 1):
    times = "  ".join(f"{ns[c] / 1e3:8.1f}" for c in ("echo", "tokio", "async-std", "mongodb"))
    print(f"{r:5}  {times}  " + "  ".join(f"{ns[a] / ns[b]:.3f}" for _, a, b, *_ in ratios))
if not rows:
    sys.exit(1)
for name, a, b, goal, sense in ratios:
    values = sorted(ns[a] / ns[b] for ns in rows)
    met = sum(v <= goal if sense == "<=" else v >= goal for v in values)
    print(f"{name}: median {statistics.median(values):.3f}, min {values[0]:.3f}, "
          f"max {values[-1]:.3f} over {len(values)} rounds; goal {sense} {goal}: "
          f"met in {met} of {len(values)}")
EOF
echo "end=$(date -u +%H:%M:%S) load=$(cut -d' ' -f1-3 /proc/loadavg)"
