#!/usr/bin/python3
"""Does computing the same phase at the same moment cost two processes more than being half a step apart?

Two processes, one thread each, train convnet's shape (conv 5x5 16, BN, ReLU, max-pool, conv 5x5 32,
BN, ReLU, max-pool, linear) on random batches of 100 with plain PyTorch (the same libtorch 1.13 as
lockstep): no communication at all, one barrier per step, as a synchronous data-parallel step has.
The same two processes alternate between two placements of that barrier, BLOCK steps at a time:

  together   both wait at the barrier before forward: both run forward, then backward, at the same
             moments, as DDP ranks do (their all-reduce lines them up at the end of every backward)
  apart      rank 0 waits before forward, rank 1 before backward: rank 1's forward runs beside rank
             0's backward and the other way round

Each step does the same work in both; only which phases coincide differs. Alternating inside the same
processes every few hundred milliseconds puts the host's drift (which moves single runs by 20% here)
on both alike. The first SETTLE steps of every block are left out. Per block: the step time (rank 0,
barrier to barrier, waiting included) and each rank's forward and backward compute (barrier wait
excluded). Medians over blocks; the difference per block pair gives the spread.

Usage: bench/in_phase.py [--steps 600] [--block 20] [--precision fp32|bf16]
"""
import argparse
import os
import multiprocessing as mp
import statistics
import subprocess
import sys
import time

SETTLE = 4
MODES = ("together", "apart")


def worker(rank, args, barrier, out):
    import torch
    import torch.nn as nn
    torch.set_num_threads(1)
    torch.manual_seed(rank)

    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 5, padding=2), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2))

    model = nn.Sequential(block(1, 16), block(16, 32), nn.Flatten(), nn.Linear(7 * 7 * 32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(100, 1, 28, 28), torch.randint(0, 10, (100,))
    bf16 = args.precision == "bf16"
    rows = []  # (block, mode, step ms, forward ms, backward ms)
    last_barrier = [None]

    def meet():  # waits at the barrier; the time since this rank last met it, in ms (None the first time)
        barrier.wait()
        now, before = time.perf_counter(), last_barrier[0]
        last_barrier[0] = now
        return None if before is None else (now - before) * 1000

    for step in range(args.steps):
        blk = step // args.block
        mode = MODES[blk % 2]
        wait_before_backward = mode == "apart" and rank == 1
        if not wait_before_backward:
            step_ms = meet()
        t0 = time.perf_counter()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = nn.functional.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        if wait_before_backward:
            step_ms = meet()
        t2 = time.perf_counter()
        loss.backward()
        opt.step()
        t3 = time.perf_counter()
        if step % args.block >= SETTLE and step_ms is not None:
            rows.append((blk, mode, step_ms, (t1 - t0) * 1000, (t3 - t2) * 1000))
    out.put((rank, rows))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = ap.parse_args()
    mp.set_start_method("spawn")
    barrier, out = mp.Barrier(2), mp.Queue()
    procs = [mp.Process(target=worker, args=(r, args, barrier, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get() for _ in procs)
    for p in procs:
        p.join()

    def per_block(rank, col):  # {block: (mode, mean of column)}
        blocks = {}
        for row in results[rank]:
            blocks.setdefault(row[0], (row[1], []))[1].append(row[col])
        return {b: (m, statistics.mean(v)) for b, (m, v) in blocks.items()}

    print(subprocess.run([os.path.join(os.path.dirname(os.path.abspath(__file__)), "machine.sh"), " ".join(sys.argv)],
                         capture_output=True, text=True).stdout, end="")
    print(f"convnet {args.precision}, batch 100, 1 thread per process, {args.steps} steps in blocks of {args.block} "
          f"(first {SETTLE} of each left out); ms, medians over blocks")
    print("| | together | apart | together - apart | per block pair: min .. max |")
    print("|---|---|---|---|---|")
    columns = (("step (rank 0, barrier to barrier)", 0, 2), ("rank 0 forward", 0, 3), ("rank 0 backward + SGD", 0, 4),
               ("rank 1 forward", 1, 3), ("rank 1 backward + SGD", 1, 4))
    for label, rank, col in columns:
        blocks = per_block(rank, col)
        by_mode = {m: [v for mm, v in blocks.values() if mm == m] for m in MODES}
        pairs = [blocks[b][1] - blocks[b + 1][1] for b in sorted(blocks) if b % 2 == 0 and b + 1 in blocks]
        t, a = (statistics.median(by_mode[m]) for m in MODES)
        print(f"| {label} | {t:.2f} | {a:.2f} | {t - a:+.2f} ({100 * (t / a - 1):+.1f}%) | "
              f"{min(pairs):+.2f} .. {max(pairs):+.2f} |")


if __name__ == "__main__":
    main()
