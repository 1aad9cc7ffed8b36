#!/usr/bin/env bash
# Issue 9 at 64 in flight: where each thread of retry-bench's round_trip bench spends a round trip,
# and how bursty the client's requests are, from counts of a running case instead of its wall time.
# See docs/benchmarks.md, "64 in flight, fourteenth session".
#
# For each case of CASES, one process runs that case without end (RETRY_BENCH_PROFILE with 10^9
# round trips) against SERVER; after WARM seconds:
#   1. `perf stat --per-thread` over WINDOW seconds: per thread group (the servers' thread
#      "bench-server", the tokio clients' workers "bench-client", the bench's own thread, which
#      runs retry-async-std's callers and driver, async-io's reactor thread), the CPU time per
#      round trip, the share of the window it was busy (for the one-thread server: 100 % minus
#      its idle share), and context switches and syscalls per round trip. A round trip is one
#      `sendto` of the server's thread (one reply).
#   2. `perf record` of the same syscalls and of the scheduler's switches over TRACE seconds: the
#      client's requests in runs (the `sendto`s of the client's threads with no `recvfrom` of a
#      client thread between them), as the share of requests written in runs of 1, 2-3, 4-7, ...
#      64; and the same for the replies read (the `recvfrom`s with no `sendto` between them);
#      and how often the server's thread went to sleep (switched out, not runnable) per round
#      trip and the share of the window it slept.
# The machine's idle share over the window is printed beside the load: the server's idle share
# means something only when the machine is idle (on a loaded one the server waits for a CPU).
#
#   scripts/bench-adapters-threads.sh
#   CASES="tokio" IN_FLIGHT=64 BENCH_BIN=target/ab/<name> scripts/bench-adapters-threads.sh
#   ENV="RETRY_BENCH_RUNTIME=event_interval=7" CASES=tokio scripts/bench-adapters-threads.sh
#
# Needs perf with the syscalls and sched tracepoints (root, or perf_event_paranoid <= -1).
# Runs a process per case for WARM + WINDOW + TRACE seconds: under `flock /work/coord/bench.lock`
# on the shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."

CASES=${CASES:-"echo tokio async-std"}
IN_FLIGHT=${IN_FLIGHT:-64}
SERVER=${SERVER:-canned}
WARM=${WARM:-3}
WINDOW=${WINDOW:-3}
TRACE=${TRACE:-0.3}
OUT=${OUT:-target/bench-adapters-threads}
mkdir -p "$OUT"

. scripts/bench-bin.sh
echo "bench binary: $BENCH_BIN in_flight=$IN_FLIGHT server=$SERVER start=$(date -u +%H:%M:%S)"

for case in $CASES; do
    # shellcheck disable=SC2086
    env ${ENV:-} RETRY_BENCH_PROFILE="$case $IN_FLIGHT 1000000000 $SERVER" "$BENCH_BIN" \
        >/dev/null 2>&1 &
    pid=$!
    sleep "$WARM"
    load=$(cut -d' ' -f1 /proc/loadavg)
    stat_start=$(head -1 /proc/stat)
    perf stat --per-thread -p "$pid" -x, -o "$OUT/$case.stat" \
        -e task-clock,context-switches,syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom \
        -e syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex -- sleep "$WINDOW"
    stat_end=$(head -1 /proc/stat)
    perf record -q -o "$OUT/$case.data" -p "$pid" \
        -e syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,sched:sched_switch \
        -- sleep "$TRACE" 2>/dev/null
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    perf script -i "$OUT/$case.data" -F comm,tid,time,event,trace >"$OUT/$case.trace" 2>/dev/null
    python3 - "$OUT/$case.stat" "$OUT/$case.trace" "$case" "$load" "$WINDOW" \
        "$stat_start" "$stat_end" <<'EOF'
import collections, re, sys

stat, trace, case, load, window = sys.argv[1:6]
window = float(window)
a, b = ([int(x) for x in line.split()[1:]] for line in sys.argv[6:8])
d = [y - x for x, y in zip(a, b)]
machine_idle = 100 * (d[3] + d[4]) / max(sum(d), 1)

threads = collections.defaultdict(dict)
for line in open(stat):
    fields = line.strip().split(",")
    if line.startswith("#") or len(fields) < 4:
        continue
    try:
        value = float(fields[1])
    except ValueError:
        continue
    group = fields[0].rsplit("-", 1)[0]
    event = fields[3].split(":")[-1].replace("sys_enter_", "")
    threads[group][event] = threads[group].get(event, 0) + value
round_trips = max(threads.get("bench-server", {}).get("sendto", 0), 1)
print(f"case={case} load={load} machine_idle={machine_idle:.0f}% "
      f"round_trip_us={window * 1e6 / round_trips:.2f}")
for group, events in sorted(threads.items()):
    cpu_ms = events.pop("task-clock", 0)
    if cpu_ms < 1:
        continue
    counts = " ".join(f"{k}={v / round_trips:.3f}" for k, v in sorted(events.items()))
    print(f"  {group:16} cpu_us={cpu_ms * 1e3 / round_trips:6.2f} "
          f"busy={100 * cpu_ms / (window * 1e3):5.1f}% per_round_trip: {counts}")

line_re = re.compile(r"\s*(.+?)\s+(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)")
events = []
for line in open(trace):
    m = line_re.match(line)
    if m:
        events.append((float(m.group(3)), m.group(1).strip(), int(m.group(2)), m.group(4), m.group(5)))
events.sort()
server = {tid for _, comm, tid, _, _ in events if comm == "bench-server"}
runs = {"sendto": collections.Counter(), "recvfrom": collections.Counter()}
kind, length, replies = None, 0, 0
asleep, slept_at, sleeps = 0.0, None, 0
for t, comm, tid, event, rest in events:
    if event.endswith("sendto") or event.endswith("recvfrom"):
        if tid in server:
            replies += event.endswith("sendto")
            continue
        this = "sendto" if event.endswith("sendto") else "recvfrom"
        if this == kind:
            length += 1
        else:
            if kind:
                runs[kind][length] += 1
            kind, length = this, 1
    elif event == "sched:sched_switch":
        prev = re.search(r"prev_pid=(\d+) .*prev_state=(\S+)", rest)
        nxt = re.search(r"next_pid=(\d+)", rest)
        if prev and int(prev.group(1)) in server and prev.group(2).startswith(("S", "D")):
            slept_at, sleeps = t, sleeps + 1
        elif nxt and int(nxt.group(1)) in server and slept_at is not None:
            asleep += t - slept_at
            slept_at = None
span = events[-1][0] - events[0][0] if events else 0
bands = [(1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 64), (65, 10**9)]
for name, counter in runs.items():
    total = sum(k * v for k, v in counter.items())
    if not total:
        continue
    shares = " ".join(
        f"{lo}{'' if lo == hi else '-' + (str(hi) if hi < 10**9 else '')}:"
        f"{100 * sum(k * v for k, v in counter.items() if lo <= k <= hi) / total:.0f}%"
        for lo, hi in bands)
    what = "requests written" if name == "sendto" else "reads"
    print(f"  client {what} in runs of (share of them): {shares}; "
          f"mean run {total / max(sum(counter.values()), 1):.1f}")
if span and replies:
    print(f"  server thread: {sleeps / replies:.3f} sleeps per round trip, asleep "
          f"{100 * asleep / span:.1f}% of {1e3 * span:.0f} ms")
EOF
done
echo "end=$(date -u +%H:%M:%S) load=$(cut -d' ' -f1-3 /proc/loadavg)"
