"""Image folders for the data tests, written with PIL, and what torchvision makes of them.

Usage: image_folders.py OUT_DIR [N_TRAIN N_VAL [N_JPEG]]

OUT_DIR/fmnist/train/<class>/<i>.png  the first N_TRAIN Fashion-MNIST training images as PNG
OUT_DIR/fmnist/val/<class>/<i>.png    the first N_VAL test images
OUT_DIR/jpeg/<class>/<i>.jpg          N_JPEG (default 0) seeded 64x64 RGB JPEG files, 10 classes
OUT_DIR/layout/...                    a tree with nested directories, mixed-case extensions, files
                                      that are not images, a hidden file and a symbolic link
OUT_DIR/layout.json                   torchvision's ImageFolder(layout): classes, class_to_idx,
                                      samples (paths relative to layout/, class index)
OUT_DIR/fmnist_batch.pt               torchvision's first 8 training samples of fmnist/train under
                                      Grayscale(), ToTensor(), Normalize((0.2860,), (0.3530,)):
                                      a dict {"data": (8, 1, 28, 28), "target": (8)}
"""
import gzip
import json
import os
import sys

import numpy as np
import torch
from PIL import Image
from torchvision import datasets, transforms

FMNIST = "/usr/share/datasets/fashion-mnist"
CLASSES = ["T-shirt", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def idx(name):
    with gzip.open(os.path.join(FMNIST, name)) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def write_split(root, images, labels):
    for i, (image, label) in enumerate(zip(images, labels)):
        d = os.path.join(root, CLASSES[label])
        os.makedirs(d, exist_ok=True)
        Image.fromarray(image, mode="L").save(os.path.join(d, "%05d.png" % i))


def write_jpegs(root, n):
    random = np.random.default_rng(0)
    ramp = np.linspace(0, 255, 64)
    for i in range(n):
        d = os.path.join(root, "class%d" % (i % 10))
        os.makedirs(d, exist_ok=True)
        base = np.stack([np.add.outer(ramp * random.random(), ramp * random.random()) / 2] * 3, axis=-1)
        image = np.clip(base * random.random(3) + random.normal(0, 20, (64, 64, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(image, mode="RGB").save(os.path.join(d, "%05d.jpg" % i), quality=90)


def write_layout(root):
    def png(path, value):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Image.new("RGB", (4, 3), (value, 2 * value % 256, 3 * value % 256)).save(path, format="PNG")

    png(os.path.join(root, "b_cat", "z.png"), 1)
    png(os.path.join(root, "b_cat", "A.PNG"), 2)
    png(os.path.join(root, "b_cat", "sub", "deep", "x.jpeg.png"), 3)
    png(os.path.join(root, "b_cat", "sub-a", "y.png"), 4)
    png(os.path.join(root, "b_cat", ".hidden.png"), 5)
    png(os.path.join(root, "a_dog", "one.png"), 6)
    Image.new("RGB", (4, 3), (7, 7, 7)).save(os.path.join(root, "a_dog", "two.JPG"), format="JPEG")
    with open(os.path.join(root, "a_dog", "notes.txt"), "w") as f:
        f.write("not an image\n")
    png(os.path.join(root, "real_bird", "b.png"), 8)
    os.symlink("real_bird", os.path.join(root, "Bird"))
    with open(os.path.join(root, "stray.png"), "wb") as f:  # beside the classes: not a sample
        f.write(b"\x89PNG")


def main():
    out = sys.argv[1]
    n_train = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    n_val = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    write_jpegs(os.path.join(out, "jpeg"), int(sys.argv[4]) if len(sys.argv) > 4 else 0)
    write_split(os.path.join(out, "fmnist", "train"), idx("train-images-idx3-ubyte.gz")[:n_train],
                idx("train-labels-idx1-ubyte.gz")[:n_train])
    write_split(os.path.join(out, "fmnist", "val"), idx("t10k-images-idx3-ubyte.gz")[:n_val],
                idx("t10k-labels-idx1-ubyte.gz")[:n_val])

    layout = os.path.join(out, "layout")
    write_layout(layout)
    folder = datasets.ImageFolder(layout)
    with open(os.path.join(out, "layout.json"), "w") as f:
        json.dump({"classes": folder.classes, "class_to_idx": folder.class_to_idx,
                   "samples": [[os.path.relpath(p, layout), c] for p, c in folder.samples]}, f)

    fmnist = datasets.ImageFolder(os.path.join(out, "fmnist", "train"), transform=transforms.Compose(
        [transforms.Grayscale(), transforms.ToTensor(), transforms.Normalize((0.2860,), (0.3530,))]))
    samples = [fmnist[i] for i in range(8)]
    batch = {"data": torch.stack([s[0] for s in samples]), "target": torch.tensor([s[1] for s in samples])}
    torch.save(batch, os.path.join(out, "fmnist_batch.pt"))


if __name__ == "__main__":
    main()
