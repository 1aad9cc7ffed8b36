#!/usr/bin/env bash
# Instruction counts (callgrind) and heap allocations (valgrind's heap summary) per OP_MSG copy,
# encode and decode, for the messages of crates/retry-core/benches/wire_codec.rs.
# See docs/benchmarks.md, "Wire codec".
set -euo pipefail
cd "$(dirname "$0")/.."
CALLS="${CALLS:-20}"
cargo build --release -q -p retry-core --example wire_codec_calls
bin=target/release/examples/wire_codec_calls
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
allocs() { valgrind "$bin" "$@" 2>&1 | awk '/total heap usage/ { gsub(",", "", $5); print $5 }'; }
echo "| message | operation | instructions per call | vs. copy | allocations per call |"
echo "| --- | --- | ---: | ---: | ---: |"
for size in 1KB 1MB; do
  copy=0
  for op in copy encode decode; do
    # Only `once` is counted, so building the message stays out of the figure.
    ins=$(valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
      --toggle-collect='wire_codec_calls::once' "$bin" "$op" "$size" "$CALLS" 2>&1 |
      awk '/Collected/ { print $4 }')
    per=$((ins / CALLS))
    [ "$op" = copy ] && copy=$per
    base=$(allocs "$op" "$size" 0)
    with=$(allocs "$op" "$size" "$CALLS")
    ratio=$(awk -v a="$per" -v b="$copy" 'BEGIN { printf "%.1f×", a / b }')
    echo "| $size | $op | $per | $ratio | $(((with - base) / CALLS)) |"
  done
done
