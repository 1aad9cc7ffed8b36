#!/usr/bin/env python3
"""Per-round-trip costs from two runs of one retry-bench case (scripts/bench-adapters-profile.sh).

Usage: bench-adapters-profile.py DIR N1 N2 LABEL, or --sched LABEL (perf script on stdin, see
`sched`). DIR holds callgrind.N-* (one file per thread)
and strace.N for N = N1 and N2 round trips; prints one line: the differences over N2 - N1.
With TOP=n in the environment it also lists the client side's n costliest functions (self cost
per round trip, with their group).

Instructions are self costs, grouped by the crate of each function's symbol. A thread that runs
server code (retry-testkit, the bench's echo or canned server) is the server side; every other
thread is the client side.
"""
import collections
import glob
import os
import re
import sys

SERVER_CODE = ("retry_testkit::", "round_trip::canned", "round_trip::echo_server")
GROUPS = [
    ("adapter", ("retry_driver::", "retry_tokio::", "retry_async_std::")),
    ("engine", ("retry_core::", "bson::")),
    ("official", ("mongodb::", "bson2::")),
    ("server", SERVER_CODE),
    ("runtime", ("tokio::", "mio::", "async_io::", "async_executor::", "async_task::",
                 "async_global_executor::", "async_std::", "polling::", "parking::",
                 "futures_lite::", "futures_util::", "futures_core::", "concurrent_queue::",
                 "event_listener", "smol::", "crossbeam", "std::sync::", "std::thread::",
                 "std::sys::", "parking_lot", "slab::")),
    ("alloc", ("malloc", "free", "realloc", "calloc", "_int_", "__rust_alloc", "__rust_dealloc",
               "__rust_realloc", "alloc::alloc::", "tcache", "unlink_chunk", "arena_",
               "sysmalloc", "memalign")),
    ("mem", ("memcpy", "memmove", "memset", "memcmp", "bcmp", "__mem", "strlen")),
]
NAME = re.compile(r"^c?fn=\((\d+)\)(?: (.*))?$")


def group(symbol):
    name = symbol.lstrip("<")
    for label, prefixes in GROUPS:
        if any(name.startswith(p) or (label in ("alloc", "mem") and p in name) for p in prefixes):
            return label
    return "other"


def callgrind_file(path, functions):
    """Self instructions per group of one thread's callgrind file; `functions` gets them per
    function."""
    names = {}
    costs = collections.Counter()
    current = None
    function = None
    skip = False
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("fn="):
                m = NAME.match(line.rstrip("\n"))
                if m.group(2) is not None:
                    names[m.group(1)] = m.group(2)
                function = names.get(m.group(1), "?")
                current = group(function)
                continue
            if line.startswith("cfn="):
                m = NAME.match(line.rstrip("\n"))
                if m and m.group(2) is not None:
                    names[m.group(1)] = m.group(2)
                continue
            if line.startswith("calls="):
                skip = True
                continue
            if current and line[:1] in "0123456789+-*":
                if skip:
                    skip = False
                    continue
                parts = line.split()
                if len(parts) >= 2:
                    costs[current] += int(parts[1])
                    functions[function] += int(parts[1])
    return costs


def callgrind(directory, n):
    sides = {"client": collections.Counter(), "server": collections.Counter()}
    functions = {"client": collections.Counter(), "server": collections.Counter()}
    for path in glob.glob(f"{directory}/callgrind.{n}*"):
        per_function = collections.Counter()
        costs = callgrind_file(path, per_function)
        side = "server" if costs["server"] > 0.01 * sum(costs.values()) else "client"
        sides[side].update(costs)
        functions[side].update(per_function)
    return sides, functions


SYSCALL = re.compile(r"^\d+\s+([a-z_0-9]+)\((.*)")


def strace(directory, n):
    counts = collections.Counter()
    with open(f"{directory}/strace.{n}", errors="replace") as f:
        for line in f:
            m = SYSCALL.match(line)
            if not m:
                continue
            name, rest = m.groups()
            if name == "futex":
                if "FUTEX_WAKE" in rest:
                    counts["futex_wake"] += 1
                    woke = re.search(r"= (\d+)", rest)
                    if woke and int(woke.group(1)) > 0:
                        counts["futex_woke_a_thread"] += 1
                elif "FUTEX_WAIT" in rest:
                    counts["futex_wait"] += 1
                continue
            if name in ("read", "write", "recvfrom", "sendto", "readv", "writev", "recvmsg",
                        "sendmsg"):
                kind = "socket" if "TCP" in rest.split(",")[0] else (
                    "eventfd" if "eventfd" in rest.split(",")[0] else "other")
                name = f"{name}({kind})"
            if "EAGAIN" in rest:
                counts[f"{name}=EAGAIN"] += 1
            counts[name] += 1
    return counts


def sched(label):
    """Per round trip, from `perf script` of sched_switch / sched_waking / cpu_idle / sendto events
    on stdin (SCHED=1): round trips = the client threads' `sendto` calls; thread wakes of the
    bench's threads, and how many of them target a CPU that is idle (halted: the costly kind on
    a VM); CPU idle entries; blocks (a bench thread switched out sleeping) and preemptions."""
    event = re.compile(r"^\s*(\S+)\s+\d+\s+\[(\d+)\]\s+[\d.]+:\s+(\S+):\s*(.*)$")
    counts = collections.Counter()
    idle = {}
    for line in sys.stdin:
        m = event.match(line)
        if not m:
            continue
        comm, cpu, name, rest = m.groups()
        if name == "power:cpu_idle":
            state = re.search(r"state=(\d+) cpu_id=(\d+)", rest)
            if state:
                entering = int(state.group(1)) != 4294967295
                idle[state.group(2)] = entering
                counts["cpu_idle_entries"] += entering
        elif name == "syscalls:sys_enter_sendto" and comm.startswith("bench-client"):
            counts["round_trips"] += 1
        elif name == "sched:sched_waking":
            target = re.search(r"comm=(\S+) .*target_cpu=(\d+)", rest)
            if target and target.group(1).startswith("bench"):
                counts["thread_wakes"] += 1
                counts["wakes_of_an_idle_cpu"] += idle.get(str(int(target.group(2))), False)
                counts["wakes_to_another_cpu"] += int(target.group(2)) != int(cpu)
        elif name == "sched:sched_switch":
            prev = re.search(r"prev_comm=(\S+) .*prev_state=(\S+) ==>", rest)
            if prev and prev.group(1).startswith("bench"):
                kind = "blocks" if prev.group(2)[:1] in "SD" else "preemptions"
                counts[f"{prev.group(1)}_{kind}"] += 1
    n = counts.pop("round_trips", 0) or 1
    detail = " ".join(f"{k}={v / n:.3f}" for k, v in sorted(counts.items()))
    print(f"{label}\n  sched (per round trip, {n} round trips traced): {detail}", flush=True)


def main():
    if sys.argv[1] == "--sched":
        return sched(sys.argv[2])
    directory, n1, n2, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    per = n2 - n1
    (a, fa), (b, fb) = callgrind(directory, n1), callgrind(directory, n2)
    parts = [label]
    for side in ("client", "server"):
        diff = {k: (b[side][k] - a[side][k]) / per for k in set(a[side]) | set(b[side])}
        total = sum(diff.values())
        detail = " ".join(f"{k}={v:.0f}" for k, v in sorted(diff.items(), key=lambda kv: -kv[1])
                          if abs(v) >= 50)
        parts.append(f"{side}_instructions={total:.0f} ({detail})")
    sa, sb = strace(directory, n1), strace(directory, n2)
    diff = {k: (sb[k] - sa[k]) / per for k in set(sa) | set(sb)}
    total = sum(v for k, v in diff.items() if not k.endswith("EAGAIN") and k != "futex_woke_a_thread")
    detail = " ".join(f"{k}={v:.2f}" for k, v in sorted(diff.items(), key=lambda kv: -kv[1])
                      if abs(v) >= 0.01)
    parts.append(f"syscalls={total:.2f} ({detail})")
    top = int(os.environ.get("TOP", "0"))
    if top:
        diff = {k: (fb["client"][k] - fa["client"][k]) / per
                for k in set(fa["client"]) | set(fb["client"])}
        for name, v in sorted(diff.items(), key=lambda kv: -kv[1])[:top]:
            parts.append(f"{v:8.0f} {group(name):8} {name[:150]}")
    print("\n  ".join(parts), flush=True)


if __name__ == "__main__":
    main()
