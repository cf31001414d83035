"""The peer's training step (../shared/peer/fmnist_ddp.py: PyTorch DDP, same models, data and
optimizer) timed by the phases `lockstep train --profile` reports, so the two steps can be set side
by side: data, forward, loss, backward (DDP's all-reduce overlaps it; its final wait is inside),
optimizer. Wall-clock per phase, no torch.profiler (whose per-op hooks would dominate a 30 ms step).
Run with the peer's environment (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT) for several ranks.
Prints rank 0's JSON: {"steps": n, "step_mean_ms": t, "phases": {"data": ms, ...}}."""
import argparse, json, os, sys, time

import torch, torch.distributed as dist, torch.nn as nn

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--peer-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "peer"))
    p.add_argument("--model", default="convnet")
    p.add_argument("--limit", type=int, default=12000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--amp", action="store_true")
    p.add_argument("--skip", type=int, default=5, help="first steps left out of the means (warm-up)")
    a = p.parse_args()
    sys.path.insert(0, a.peer_dir)
    from fmnist_ddp import D, MODELS, idx  # the peer's own models and data reader

    world = int(os.environ.get("WORLD_SIZE", "1")); rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    X = torch.from_numpy(idx(f"{D}/train-images-idx3-ubyte.gz").astype("float32") / 255.0)[: a.limit]
    Y = torch.from_numpy(idx(f"{D}/train-labels-idx1-ubyte.gz").astype("int64"))[: a.limit]
    ds = torch.utils.data.TensorDataset(X, Y)
    sampler = torch.utils.data.distributed.DistributedSampler(ds, world, rank, shuffle=True, seed=0) if world > 1 else None
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=sampler is None, sampler=sampler, num_workers=0)
    model = MODELS[a.model]()
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    crit = nn.CrossEntropyLoss()
    names = ["data", "forward", "loss", "backward", "optimizer"]
    totals = dict.fromkeys(names, 0.0); steps = 0
    it = iter(dl)
    while True:
        t0 = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp):
            out = model(x)
            t2 = time.perf_counter()
            loss = crit(out, y)
        t3 = time.perf_counter()
        opt.zero_grad(set_to_none=True); loss.backward()
        t4 = time.perf_counter()
        opt.step()
        t5 = time.perf_counter()
        if steps >= a.skip:
            for name, d in zip(names, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                totals[name] += d
        steps += 1
    n = max(1, steps - a.skip)
    phases = {k: round(v / n * 1e3, 3) for k, v in totals.items()}
    if rank == 0:
        print(json.dumps({"peer": "pytorch-python", "world": world, "amp": a.amp, "steps": n,
                          "step_mean_ms": round(sum(phases.values()), 3), "phases": phases}))
    if world > 1:
        dist.destroy_process_group()

if __name__ == "__main__":
    main()
