#!/usr/bin/env bash
# Instruction counts (callgrind) and heap allocations (valgrind's heap summary) per server
# selection, for the cases of crates/retry-core/benches/selection.rs. See docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
CALLS="${CALLS:-1000}"
cargo build --release -q -p retry-core --example selection_calls
bin=target/release/examples/selection_calls
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
allocs() { valgrind "$bin" "$@" 2>&1 | awk '/total heap usage/ { gsub(",", "", $5); print $5 }'; }
echo "| case | servers | instructions per call | allocations per call |"
echo "| --- | ---: | ---: | ---: |"
for shape in rs-tags sharded; do
  for n in 3 50 1000; do
    # Only select_once is counted, so setup and teardown stay out of the figure.
    ins=$(valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
      --toggle-collect='selection_calls::select_once' "$bin" "$shape" "$n" "$CALLS" 2>&1 |
      awk '/Collected/ { print $4 }')
    # Allocations of CALLS selections minus those of the same run with none.
    base=$(allocs "$shape" "$n" 0)
    with=$(allocs "$shape" "$n" "$CALLS")
    echo "| $shape | $n | $((ins / CALLS)) | $(((with - base) / CALLS)) |"
  done
done
