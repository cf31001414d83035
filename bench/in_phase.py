#!/usr/bin/python3
"""Does computing the same phase at the same moment cost two processes more than drifting apart?

Two processes, one thread each, train convnet's shape (conv 5x5 16, BN, ReLU, max-pool, conv 5x5 32,
BN, ReLU, max-pool, linear) on random batches of 100 with plain PyTorch: no communication at all.
"in phase": a barrier before every step, so both run forward, then backward, at the same moments,
as DDP ranks do. "drifting": no barrier, as two independent processes do. Only the compute is
timed (forward + backward + SGD step, from after the barrier), so any difference is what sharing
the cores costs more when the phases coincide. Configurations alternate, RUNS times each.

Usage: bench/in_phase.py [--runs 5] [--steps 200]
"""
import argparse
import multiprocessing as mp
import statistics
import time


def worker(rank, steps, barrier, out):
    import torch
    import torch.nn as nn
    torch.set_num_threads(1)
    torch.manual_seed(rank)

    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 5, padding=2), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2))

    model = nn.Sequential(block(1, 16), block(16, 32), nn.Flatten(), nn.Linear(7 * 7 * 32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(100, 1, 28, 28), torch.randint(0, 10, (100,))
    times = []
    for step in range(steps):
        if barrier is not None:
            barrier.wait()
        t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    out.put((rank, statistics.mean(times[10:]) * 1000))


def once(steps, in_phase):
    barrier = mp.Barrier(2) if in_phase else None
    out = mp.Queue()
    procs = [mp.Process(target=worker, args=(r, steps, barrier, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return statistics.mean(ms for _, ms in results)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    mp.set_start_method("spawn")
    rows = {"in phase": [], "drifting": []}
    for i in range(args.runs):
        for name in rows:
            rows[name].append(once(args.steps, name == "in phase"))
        print(f"run {i + 1}: compute ms/step in phase {rows['in phase'][-1]:.2f}, drifting {rows['drifting'][-1]:.2f}")
    a, b = statistics.median(rows["in phase"]), statistics.median(rows["drifting"])
    print(f"medians of {args.runs}: in phase {a:.2f} ms/step, drifting {b:.2f}: in phase costs {a - b:+.2f} ms "
          f"({100 * (a / b - 1):+.1f}%)")


if __name__ == "__main__":
    main()
