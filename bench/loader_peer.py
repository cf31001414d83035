"""torchvision's ImageFolder + DataLoader over the same folder and transforms as `lockstep bench
--loader`: one line of JSON with images/s.

Usage: loader_peer.py DATA_DIR TRANSFORM WORKERS [BATCH_SIZE EPOCHS]
TRANSFORM is the same spec lockstep takes, e.g. "Grayscale(), ToTensor()", evaluated with
torchvision.transforms' names in scope.
"""
import json
import sys
import time

import torch
from torchvision import datasets, transforms


def main():
    data_dir, spec, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    batch_size = int(sys.argv[4]) if len(sys.argv) > 4 else 64
    epochs = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    torch.set_num_threads(1)
    steps = eval("[" + spec.replace(";", ",") + "]", dict(vars(transforms)))
    steps = [s() if isinstance(s, type) else s for s in steps]
    if not any(isinstance(s, transforms.ToTensor) for s in steps):
        steps.append(transforms.ToTensor())
    folder = datasets.ImageFolder(data_dir, transform=transforms.Compose(steps))
    background = {"persistent_workers": True, "prefetch_factor": 2} if workers > 0 else {}
    loader = torch.utils.data.DataLoader(folder, batch_size=batch_size, shuffle=True, num_workers=workers, **background)
    images = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for x, _ in loader:
            images += x.shape[0]
    seconds = time.perf_counter() - t0
    print(json.dumps({"images": images, "seconds": round(seconds, 4), "images_per_s": round(images / seconds, 1)}))


if __name__ == "__main__":
    main()
