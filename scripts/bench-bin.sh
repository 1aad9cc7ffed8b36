# Sourced by the scripts/bench-adapters-*.sh scripts: sets BENCH_BIN to the retry-bench round-trip
# bench binary (with the official driver, `--features mongodb`), building it first, unless the
# caller set BENCH_BIN already.
if [ -z "${BENCH_BIN:-}" ]; then
    BENCH_BIN=$(cargo bench -p retry-bench --features mongodb --bench round_trip --no-run \
        --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "round_trip":
        print(m["executable"])')
fi
