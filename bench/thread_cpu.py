#!/usr/bin/python3
"""Where a command's processes spend CPU, thread by thread, from the kernel's scheduler statistics.

Runs COMMAND and, every 50 ms until it exits, reads /proc/PID/task/TID/schedstat and status for it
and every process below it. For each thread it keeps the last reading, and sums them per process:
its main thread alone, its other threads by name. A reading is: time on a CPU, time runnable but
waiting for one (the run queue: another thread or process had the core), and voluntary and
involuntary context switches. A thread's figures are cumulative, so the last reading before it
exits is its whole life (to within 50 ms).

What it answers for a DDP run on 2 cores: how much CPU the threads beside each rank's compute thread
(Gloo's, the shared-memory worker's) take, and how long the compute thread waited for a core.

Usage: bench/thread_cpu.py [--min-ms 1] -- COMMAND...
"""
import argparse
import collections
import os
import subprocess
import sys
import time


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def tree(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children(p))
    return out


def read_thread(pid, tid):
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            run_ns, wait_ns, _ = (int(v) for v in f.read().split())
        fields = {}
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                fields[k] = v.strip()
        return fields["Name"], run_ns, wait_ns, int(fields["voluntary_ctxt_switches"]), \
            int(fields["nonvoluntary_ctxt_switches"])
    except (OSError, KeyError, ValueError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-ms", type=float, default=1.0, help="leave out threads with less CPU than this")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command given")
    start = time.monotonic()
    proc = subprocess.Popen(cmd)
    last, names = {}, {}
    while proc.poll() is None:
        for pid in tree(proc.pid):
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    name = f.read().split(b"\0")[0].decode(errors="replace").rsplit("/", 1)[-1]
                names[pid] = name or names.get(pid, "?")  # an exiting process reads empty: keep its name
            except OSError:
                continue
            for tid in tids:
                r = read_thread(pid, tid)
                if r is not None:
                    last[(pid, tid)] = r
        time.sleep(0.05)
    wall = time.monotonic() - start
    groups = collections.defaultdict(lambda: [0, 0, 0, 0, 0])  # (pid, thread) -> threads, run, wait, vol, invol
    for (pid, tid), (name, run_ns, wait_ns, vol, invol) in last.items():
        g = groups[(pid, "main" if tid == pid else name)]
        for i, v in enumerate((1, run_ns, wait_ns, vol, invol)):
            g[i] += v
    print(subprocess.run([os.path.join(os.path.dirname(os.path.abspath(__file__)), "machine.sh"), " ".join(sys.argv)],
                         capture_output=True, text=True).stdout, end="")
    print(f"{' '.join(cmd)}\nwall {wall:.2f} s; per process: its main thread and its other threads by name, "
          "cumulative over each thread's life:")
    print("| pid | process | thread | threads | on CPU ms | waiting for a CPU ms | voluntary switches | involuntary |")
    print("|---|---|---|---|---|---|---|---|")
    for (pid, name), (n, run_ns, wait_ns, vol, invol) in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[1][1])):
        if run_ns / 1e6 >= args.min_ms:
            print(f"| {pid} | {names.get(pid, '?')} | {name} | {n} | {run_ns / 1e6:.1f} | {wait_ns / 1e6:.1f} "
                  f"| {vol} | {invol} |")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
