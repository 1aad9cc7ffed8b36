#!/usr/bin/env bash
# Server instructions per command of retry-testkit (issue 9, docs/benchmarks.md "Test server cost
# per command"): runs the command_cost bench binary with N1 and N2 round trips of each command
# under callgrind (one file per thread) and strace, and prints the per-command difference of the
# server thread (scripts/bench-adapters-profile.py, which also prints the client thread: here
# a blocking std::net client).
#
#   crates/retry-testkit/scripts/command-cost.sh                        # builds the bench, every command
#   COMMANDS="ping hello-heartbeat" BIN=target/release/deps/command_cost-<hash> crates/retry-testkit/scripts/command-cost.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
COMMANDS=${COMMANDS:-"ping hello-handshake hello-heartbeat isMaster"}
N1=${N1:-1000}
N2=${N2:-3000}
OUT=${OUT:-target/testkit-command-cost}
if [ -z "${BIN:-}" ]; then
    BIN=$(cargo bench -p retry-testkit --bench command_cost --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "command_cost":
        print(m["executable"])')
fi
echo "bench binary: $BIN"
for command in $COMMANDS; do
    dir="$OUT/$command"
    rm -rf "$dir" && mkdir -p "$dir"
    for n in "$N1" "$N2"; do
        TESTKIT_COST="$command $n" valgrind --tool=callgrind --separate-threads=yes \
            --callgrind-out-file="$dir/callgrind.$n" "$BIN" >/dev/null 2>"$dir/valgrind.$n.log" || true
        TESTKIT_COST="$command $n" strace -f -qq -yy -o "$dir/strace.$n" "$BIN" >/dev/null 2>&1 || true
    done
    python3 scripts/bench-adapters-profile.py "$dir" "$N1" "$N2" "command=$command"
done
