#!/usr/bin/env bash
# Instruction counts (callgrind) and heap allocations (valgrind's heap summary) per engine
# operation in the simulated driver, and per codec round trip (the baseline), for the cases of
# crates/retry-sim/benches/engine.rs. See docs/benchmarks.md, "Engine".
set -euo pipefail
cd "$(dirname "$0")/.."
CALLS="${CALLS:-1000}"
cargo build --release -q -p retry-sim --example engine_calls
bin=target/release/examples/engine_calls
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
allocs() { valgrind "$bin" "$@" 2>&1 | awk '/total heap usage/ { gsub(",", "", $5); print $5 }'; }
echo "| case | instructions per call | vs. baseline | allocations per call |"
echo "| --- | ---: | ---: | ---: |"
baseline=0
for case in codec engine; do
  # Only `once` is counted, so building and warming up the simulation stay out of the figure.
  ins=$(valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
    --toggle-collect='engine_calls::once' "$bin" "$case" "$CALLS" 2>&1 |
    awk '/Collected/ { print $4 }')
  per=$((ins / CALLS))
  [ "$case" = codec ] && baseline=$per
  # Allocations of CALLS calls minus those of the same run with none.
  base=$(allocs "$case" 0)
  with=$(allocs "$case" "$CALLS")
  ratio=$(awk -v a="$per" -v b="$baseline" 'BEGIN { printf "%.1f×", a / b }')
  echo "| $case | $per | $ratio | $(((with - base) / CALLS)) |"
done
