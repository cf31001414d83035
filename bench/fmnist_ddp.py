"""Peer baseline: PyTorch (Python) DDP on CPU/gloo, the classic two-block ConvNet on Fashion-MNIST.
shared/peer/fmnist_ddp.py with one addition for PyTorch 2.x, --compile: the model through
torch.compile (inductor, CPU), as a Python user chasing speed would run it. Its first step compiles
(compile_s, printed) and is not timed: samples/s is then the compiled model's steady rate.
Run single: .venv/bin/python bench/fmnist_ddp.py --epochs 1   [--model convnet|mlp-wide] [--compile]
Run DDP:    PEER_DIR=bench N=2 ../shared/peer/run_ddp.sh ...  (bench/ddp_vs_peer.sh does it)
Prints one JSON line from rank 0: samples/s, epoch seconds, test accuracy, peak RSS MiB."""
import argparse, gzip, json, os, resource, struct, time
import numpy as np, torch, torch.nn as nn, torch.distributed as dist

D = "/usr/share/datasets/fashion-mnist"

def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 2051:
        r, c = struct.unpack(">II", data[8:16])
        return np.frombuffer(data, np.uint8, offset=16).reshape(n, 1, r, c)
    return np.frombuffer(data, np.uint8, offset=8)

class ConvNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.layer1 = nn.Sequential(nn.Conv2d(1, 16, 5, 1, 2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2, 2))
        self.layer2 = nn.Sequential(nn.Conv2d(16, 32, 5, 1, 2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2, 2))
        self.fc = nn.Linear(7 * 7 * 32, num_classes)
    def forward(self, x):
        return self.fc(self.layer2(self.layer1(x)).reshape(x.size(0), -1))

class WideMLP(nn.Module):
    """About 7.4M parameters: a communication-bound model for DDP at small batches."""
    def __init__(self, num_classes=10):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 4096)
        self.fc2 = nn.Linear(4096, 1024)
        self.fc3 = nn.Linear(1024, num_classes)
    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x.flatten(1))))))

MODELS = {"convnet": ConvNet, "mlp-wide": WideMLP}

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", "--batch", dest="batch", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--amp", action="store_true", help="CPU autocast bf16")
    p.add_argument("--model", choices=sorted(MODELS), default="convnet")
    p.add_argument("--compile", action="store_true", help="torch.compile the model; its first step is not timed")
    a = p.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1")); rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    X = torch.from_numpy(idx(f"{D}/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    Y = torch.from_numpy(idx(f"{D}/train-labels-idx1-ubyte.gz").astype(np.int64))
    Xt = torch.from_numpy(idx(f"{D}/t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    Yt = torch.from_numpy(idx(f"{D}/t10k-labels-idx1-ubyte.gz").astype(np.int64))
    if a.limit:
        X, Y = X[: a.limit], Y[: a.limit]
    ds = torch.utils.data.TensorDataset(X, Y)
    sampler = torch.utils.data.distributed.DistributedSampler(ds, world, rank, shuffle=True, seed=0) if world > 1 else None
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=sampler is None, sampler=sampler, num_workers=0)
    model = MODELS[a.model]()
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    if a.compile:
        model = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    crit = nn.CrossEntropyLoss()
    n = 0; t0 = time.perf_counter(); compile_s = 0.0
    for ep in range(a.epochs):
        if sampler: sampler.set_epoch(ep)
        model.train()
        for x, y in dl:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp):
                loss = crit(model(x), y)
            opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
            if a.compile and compile_s == 0.0:  # the step that compiled: not timed
                compile_s = time.perf_counter() - t0; t0 = time.perf_counter()
                continue
            n += x.size(0)
    el = time.perf_counter() - t0
    model.eval(); correct = 0
    with torch.no_grad():
        for i in range(0, Xt.size(0), 1000):
            correct += (model(Xt[i:i+1000]).argmax(1) == Yt[i:i+1000]).sum().item()
    tot = torch.tensor([float(n)])
    if world > 1: dist.all_reduce(tot)
    if rank == 0:
        print(json.dumps({"peer": "pytorch-python", "world": world, "threads": torch.get_num_threads(), "amp": a.amp,
                          "samples_per_s": round(tot.item() / el, 1), "train_s": round(el, 2),
                          "compile": a.compile, "compile_s": round(compile_s, 2), "torch": torch.__version__,
                          "test_acc": round(correct / Xt.size(0), 4),
                          "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
    if world > 1: dist.destroy_process_group()

if __name__ == "__main__":
    main()
