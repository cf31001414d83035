#!/usr/bin/python3
"""What synchronous data parallelism costs on this machine, step by step, from `--trace` files.

Three configurations, alternating, RUNS times (medians of the runs' means):
  alone        one process, one thread, the machine otherwise idle
  independent  two such processes at once, each on half the samples, not talking to each other
  ddp          `lockstep run --nproc-per-node 2`, the same model and batch per rank
A step's time is from the start of its first phase to the start of the next step's (rank 0's trace;
each independent process is rank 0 of its own run). The first WARMUP steps are left out.

From them:
  sharing      independent - alone: two processes computing at once on 2 cores (caches, memory
               bandwidth, the host's other tenants); no scheme with 2 busy ranks avoids it
  waiting      E[max(X, Y)] - E[X] for X, Y drawn from the two independent processes' step times:
               what a rank loses by waiting, every step, for the slower of two ranks whose step
               times vary as these do, if nothing else changed
  the rest     ddp - independent - waiting: the collectives themselves and anything else DDP adds
and the scaling each leaves: 2 x alone / step time.

Usage: bench/sync_cost.py [--runs 3] [--model convnet] [--limit 30000] [--batch 100] [--precision fp32]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

WARMUP = 5


def step_times(trace_path):
    """Per-step times in ms (start to next start) and mean ms per phase, after WARMUP steps."""
    events = json.load(open(trace_path))["traceEvents"]
    starts, phases = {}, {}
    for e in events:
        s = e["args"]["step"]
        starts[s] = min(starts.get(s, e["ts"]), e["ts"])
        if s >= WARMUP:
            phases[e["name"]] = phases.get(e["name"], 0.0) + e["dur"] / 1000
    order = sorted(starts)
    times = [(starts[order[i + 1]] - starts[order[i]]) / 1000 for i in range(len(order) - 1)][WARMUP:]
    counted = max(1, len([s for s in order if s >= WARMUP]))
    return times, {k: v / counted for k, v in phases.items()}


def train_cmd(binary, args, limit, trace, seed=1):
    cmd = [binary, "train", "--quiet", "--model", args.model, "--limit", str(limit), "--epochs", "1",
           "--batch-size", str(args.batch), "--lr", "0.05", "--threads", "1", "--seed", str(seed), "--trace", trace]
    return cmd + (["--precision", "bf16"] if args.precision == "bf16" else [])


def run(cmds):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in cmds]
    for p, c in zip(procs, cmds):
        _, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"{' '.join(c)} failed ({p.returncode}):\n{err.decode()[-2000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model", default="convnet")
    ap.add_argument("--limit", type=int, default=30000, help="samples per rank (ddp: twice this in all)")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--binary", default=os.path.join(os.path.dirname(__file__), "..", "build", "lockstep"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sync_cost-")
    rows = {k: [] for k in ("alone", "independent", "ddp", "waiting")}
    phases = {k: [] for k in ("alone", "independent", "ddp")}
    random.seed(1)
    for i in range(args.runs):
        t = {k: os.path.join(tmp, f"{k}.json") for k in ("alone", "ind0", "ind1", "ddp")}
        run([train_cmd(args.binary, args, args.limit, t["alone"])])
        run([train_cmd(args.binary, args, args.limit, t["ind0"]), train_cmd(args.binary, args, args.limit, t["ind1"], 2)])
        run([[args.binary, "run", "--nproc-per-node", "2", "--"] + train_cmd(args.binary, args, 2 * args.limit, t["ddp"])])
        alone, pa = step_times(t["alone"])
        ind0, p0 = step_times(t["ind0"])
        ind1, p1 = step_times(t["ind1"])
        ddp, pd = step_times(t["ddp"])
        pairs = [max(random.choice(ind0), random.choice(ind1)) for _ in range(100000)]
        rows["alone"].append(statistics.mean(alone))
        rows["independent"].append(statistics.mean(ind0 + ind1))
        rows["ddp"].append(statistics.mean(ddp))
        rows["waiting"].append(statistics.mean(pairs) - statistics.mean(ind0 + ind1))
        both = {n: (p0.get(n, 0.0) + p1.get(n, 0.0)) / 2 for n in set(p0) | set(p1)}  # the two processes' mean
        for k, p in (("alone", pa), ("independent", both), ("ddp", pd)):
            phases[k].append(p)
        sd = lambda x: statistics.stdev(x)
        print(f"run {i + 1}: ms/step alone {rows['alone'][-1]:.2f} (sd {sd(alone):.2f}), independent "
              f"{rows['independent'][-1]:.2f} (sd {sd(ind0 + ind1):.2f}), ddp {rows['ddp'][-1]:.2f} (sd {sd(ddp):.2f}); "
              f"waiting for the slower of two independent steps {rows['waiting'][-1]:.2f}", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in rows.items()}
    names = ["data", "forward", "loss", "backward", "sync", "optimizer"]
    ph = {k: {n: statistics.median([p.get(n, 0.0) for p in v]) for n in names} for k, v in phases.items()}
    print(subprocess.run([os.path.join(os.path.dirname(os.path.abspath(__file__)), "machine.sh"), " ".join(sys.argv)],
                         capture_output=True, text=True).stdout, end="")
    print(f"{args.model} {args.precision}, batch {args.batch} per rank, {args.limit} samples per rank, "
          f"1 thread per process; ms per step, medians of {args.runs} runs (means over steps {WARMUP + 1}..)")
    print("| configuration | ms/step | " + " | ".join(names) + " | scaling (2 x alone / step) |")
    print("|---" * (len(names) + 3) + "|")
    for k, label in (("alone", "one process alone"), ("independent", "two independent processes at once"),
                     ("ddp", "DDP, 2 ranks (rank 0)")):
        scaling = "1.00x (one process)" if k == "alone" else f"{2 * med['alone'] / med[k]:.2f}x"
        print(f"| {label} | {med[k]:.2f} | " + " | ".join(f"{ph[k][n]:.2f}" for n in names) + f" | {scaling} |")
    rest = med["ddp"] - med["independent"] - med["waiting"]
    print(f"\nsharing the 2 cores: +{med['independent'] - med['alone']:.2f} ms/step (ceiling for 2 busy ranks: "
          f"{2 * med['alone'] / med['independent']:.2f}x)")
    print(f"waiting for the slower rank, predicted from the independent steps' spread: +{med['waiting']:.2f} ms/step "
          f"(ceiling for synchronous steps: {2 * med['alone'] / (med['independent'] + med['waiting']):.2f}x)")
    print(f"the rest of DDP (collectives, hand-offs): {rest:+.2f} ms/step")


if __name__ == "__main__":
    main()
