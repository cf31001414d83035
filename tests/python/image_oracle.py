"""Image files and what torchvision makes of them: `python3 image_oracle.py OUT_DIR`.

Writes into OUT_DIR PNGs of every colour type PIL reads (and a few only a hand-built file has: 2-
and 4-bit grey, 16-bit colour), JPEGs (grey, 4:2:0, 4:4:4, progressive), broken files, and
oracle.pt: torch.save of a dict of uint8 or float tensors, keyed
  decoded/<file>    PIL's Image.open(file).convert("RGB"), (H, W, 3): torchvision's ImageFolder loader
  <transform case>  torchvision 0.14's output on the PIL path: uint8 (H, W, C) before ToTensor,
                    float (C, H, W) after
The sources of the transform cases are decoded/rgb.png (61 x 47 smooth colours with noise) and
decoded/noise.png (311 x 203 uniform noise, the worst case for a downscaling filter).
"""
import os
import struct
import sys
import zlib

import numpy as np
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as F
from PIL import Image


def raw_png(path, width, height, depth, colour, rows):
    """A PNG written byte by byte, for layouts PIL does not write (2/4-bit grey, 16-bit colour)."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    data = zlib.compress(b"".join(b"\0" + row for row in rows))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b""))


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(31)
    y, x = np.mgrid[0:61, 0:47]
    smooth = np.stack([x * 5, y * 4, (x + y) * 2], axis=-1).astype(np.float64)
    rgb = np.clip(smooth + rng.normal(0, 12, smooth.shape), 0, 255).astype(np.uint8)
    alpha = rng.integers(0, 256, (61, 47), dtype=np.uint8)

    Image.fromarray(rgb).save(f"{out}/rgb.png")
    Image.fromarray(rgb).convert("L").save(f"{out}/l.png")
    Image.fromarray(np.dstack([rgb[..., 0], alpha])).convert("LA").save(f"{out}/la.png")
    Image.fromarray(np.dstack([rgb, alpha])).save(f"{out}/rgba.png")
    Image.fromarray(rgb).quantize(7).save(f"{out}/p.png")
    Image.fromarray(rgb).quantize(5).save(f"{out}/p_trns.png", transparency=2)
    Image.fromarray(rgb).convert("1").save(f"{out}/bit1.png")
    Image.fromarray(rng.integers(0, 256, (203, 311, 3), dtype=np.uint8)).save(f"{out}/noise.png")
    for depth in (2, 4):
        rows = [rng.integers(0, 256, 6, dtype=np.uint8).tobytes() for _ in range(5)]
        raw_png(f"{out}/bit{depth}.png", 48 // depth, 5, depth, 0, rows)
    grey16 = rng.integers(0, 65536, (9, 11), dtype=np.uint16)
    grey16[0, :6] = [0, 1, 200, 255, 256, 65535]  # around PIL's clip at 255
    raw_png(f"{out}/grey16.png", 11, 9, 16, 0, [r.astype(">u2").tobytes() for r in grey16])
    for name, colour, channels in (("rgb16", 2, 3), ("rgba16", 6, 4), ("la16", 4, 2)):
        rows = [rng.integers(0, 65536, 7 * channels, dtype=np.uint16).astype(">u2").tobytes() for _ in range(6)]
        raw_png(f"{out}/{name}.png", 7, 6, 16, colour, rows)

    photo = Image.fromarray(np.clip(smooth * 0.9 + rng.normal(0, 6, smooth.shape), 0, 255).astype(np.uint8))
    photo.convert("L").save(f"{out}/grey.jpg", quality=90)
    photo.save(f"{out}/rgb420.jpg", quality=85, subsampling=2)
    photo.save(f"{out}/rgb444.jpg", quality=95, subsampling=0)
    photo.save(f"{out}/progressive.jpg", quality=80, progressive=True)

    oracle = {}
    for name in sorted(os.listdir(out)):
        with Image.open(f"{out}/{name}") as im:
            oracle[f"decoded/{name}"] = torch.from_numpy(np.array(im.convert("RGB")))

    # Broken files: each must throw naming the file.
    png, jpg = open(f"{out}/rgb.png", "rb").read(), open(f"{out}/rgb420.jpg", "rb").read()
    open(f"{out}/truncated.png", "wb").write(png[: len(png) // 2])
    open(f"{out}/truncated.jpg", "wb").write(jpg[: len(jpg) // 2])
    idat = png.index(b"IDAT") + 40
    open(f"{out}/corrupt.png", "wb").write(png[:idat] + bytes(b ^ 0x5A for b in png[idat:idat + 64]) + png[idat + 64:])
    sos = jpg.index(b"\xff\xda")
    open(f"{out}/corrupt.jpg", "wb").write(jpg[:20] + b"\xff\xc4\x00\x03\x99" + jpg[sos:])
    open(f"{out}/text.jpg", "w").write("not an image, only its name says so\n")
    open(f"{out}/empty.png", "wb").close()

    img = Image.open(f"{out}/rgb.png").convert("RGB")
    noise = Image.open(f"{out}/noise.png").convert("RGB")

    def hwc(pil):
        a = torch.from_numpy(np.array(pil))
        return a.unsqueeze(-1) if a.dim() == 2 else a

    cases = {
        "resize/int_down": F.resize(img, 20),
        "resize/int_up": F.resize(img, 90),
        "resize/pair_down": F.resize(img, [17, 29]),
        "resize/pair_up": F.resize(img, [100, 71]),
        "resize/pair_mixed": F.resize(img, [30, 80]),
        "resize/max_size": F.resize(img, 30, max_size=35),
        "resize/noise_int": F.resize(noise, 32),
        "resize/noise_pair": F.resize(noise, [50, 77]),
        "resize/grey": F.resize(F.to_grayscale(img), 19),
        "center_crop/odd_margins": F.center_crop(img, 20),
        "center_crop/pair": F.center_crop(img, [31, 46]),
        "center_crop/larger": F.center_crop(img, [70, 50]),
        "center_crop/wider": F.center_crop(img, [20, 60]),
        "grayscale/1": F.to_grayscale(img, 1),
        "grayscale/3": F.to_grayscale(img, 3),
        "resized_crop": F.resized_crop(img, 5, 7, 30, 25, [24, 24]),
        "resized_crop/noise": F.resized_crop(noise, 11, 3, 150, 190, [37, 29]),
        "crop/outside": F.crop(img, -3, 40, 20, 30),
        "pad/ltrb": F.pad(img, [1, 2, 3, 4], fill=(10, 20, 30)),
        "pad/int": F.pad(img, 3, fill=7),
        "hflip": F.hflip(img),
    }
    for key, value in cases.items():
        oracle[key] = hwc(value)
    oracle["to_tensor"] = T.ToTensor()(img)
    oracle["normalize"] = T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))(T.ToTensor()(img))
    oracle["pipeline"] = T.Compose([T.Resize(32), T.CenterCrop(28), T.ToTensor(), T.Normalize((0.5,), (0.5,))])(
        Image.open(f"{out}/rgb420.jpg").convert("RGB"))
    torch.save(oracle, f"{out}/oracle.pt")


if __name__ == "__main__":
    main()
