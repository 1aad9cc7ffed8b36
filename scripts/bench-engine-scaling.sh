#!/usr/bin/env bash
# How the engine's cost per operation scales with the operations in flight (issue 9, house rule 9:
# cost follows the work). For each N, `crates/retry-sim/examples/engine_scaling.rs` starts N reads
# at once on three mongos (default pool options) in the simulated driver and runs them to
# completion, after a warm-up burst of the same size (unmeasured: pools grown, buffers sized).
# Prints one line per N:
#
#   in_flight=N instructions_per_op=X allocations_per_op=Y
#
# and first the baseline, the codec work of one OP_MSG round trip (encode + decode the command
# and the reply) at one in flight, in the same format with `baseline=codec` in front, and last the
# engine's ratio to it at one in flight.
#
# Exactness: instructions are callgrind's count of the never-inlined `engine_scaling::measured`
# (the measured burst) and everything it calls, via --toggle-collect, so building the simulation
# and the warm-up burst are not counted. Allocations are counted by the example's own global
# allocator, switched on only around the measured burst (every alloc and realloc counts once).
# Both include the simulated driver's own work (its delivery queue, sockets map and the servers'
# encode/decode), as the per-operation figures in docs/benchmarks.md do; the counting allocator
# adds one relaxed atomic load and add per allocation to the instruction count. The figures do
# not depend on the machine's load (instruction counts, virtual time, a fixed seed).
#
# Run time: after issue 9's routed engine, the whole script (every N up to 10000) takes about
# 20 s under callgrind on one core. On the fixed-point engine of main before issue 9, N=10000 alone
# took 131 s without valgrind (about 2 hours under callgrind), so it was left out there. Choose the
# sizes with NS, e.g.
#   NS="1 10 100 1000" scripts/bench-engine-scaling.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NS="${NS:-1 10 100 1000 10000}"
if ! command -v valgrind >/dev/null; then
  apt-get install -y valgrind >/dev/null
fi
cargo build --release -q -p retry-sim --example engine_scaling
bin=target/release/examples/engine_scaling
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# measure CASE N: prints "instructions_per_op=X allocations_per_op=Y"
measure() {
  local log="$out/log" ins allocs
  valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
    --toggle-collect='engine_scaling::measured' "$bin" "$1" "$2" >"$out/stdout" 2>"$log"
  ins=$(awk '/Collected/ { print $4 }' "$log")
  allocs=$(sed -n 's/.* allocations=\([0-9]*\) .*/\1/p' "$out/stdout")
  awk -v i="$ins" -v a="$allocs" -v n="$2" \
    'BEGIN { printf "instructions_per_op=%d allocations_per_op=%.1f\n", i / n, a / n }'
}
baseline=$(measure codec 1)
echo "baseline=codec in_flight=1 $baseline"
first=""
for n in $NS; do
  line=$(measure engine "$n")
  echo "in_flight=$n $line"
  [ -z "$first" ] && [ "$n" = 1 ] && first=$line
done
if [ -n "$first" ]; then
  e=${first#instructions_per_op=}; e=${e%% *}
  b=${baseline#instructions_per_op=}; b=${b%% *}
  awk -v e="$e" -v b="$b" 'BEGIN { printf "ratio_to_codec_at_in_flight_1 instructions=%.1fx\n", e / b }'
fi
