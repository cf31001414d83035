#!/usr/bin/env python3
"""Models defined in Python, saved as TorchScript for lockstep to train and serve.

Usage: torchscript_models.py OUT_DIR
Writes to OUT_DIR:
  residual_mlp.pt, residual_mlp_io.json  torch.jit.script of a residual MLP with LayerNorm and GELU
      (16 inputs, 4 outputs; eval mode), and a batch of inputs with the module's outputs for them
      (tests/serve/torchscript_serve_test.cpp, tests/models/torchscript_module_test.cpp).
  image_mlp.pt        the residual MLP on Fashion-MNIST images: Flatten, Linear(784, 64), two
                      residual blocks in a Sequential, Linear(64, 10); scripted, training mode.
  image_mlp_traced.pt the same model traced with a (3, 1, 28, 28) example.
  cnn.pt              a small CNN with BatchNorm and dropout whose first convolution is frozen
                      (requires_grad=False); scripted. Its forward calls torch.flatten itself, so
                      it has no chain of blocks (fsdp and pipelines refuse it).
  mlp16_traced.pt     the 16-input residual MLP traced with a (3, 16) example: not for images.
  two_tensors.pt      a module whose forward takes two tensors.
  no_parameters.pt    a module with a buffer and no parameter.
  state_dict.pt       torch.save of image_mlp's state dict: not TorchScript.
"""
import json
import sys

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


class ResidualMlp(nn.Module):
    def __init__(self, inputs: int = 16, width: int = 32, outputs: int = 4):
        super().__init__()
        self.embed = nn.Linear(inputs, width)
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.head = nn.Linear(width, outputs)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x)))


class ImageMlp(nn.Module):
    """ResidualMlp on (B, 1, 28, 28) images: its children are called one after another."""

    def __init__(self, width: int = 64, classes: int = 10):
        super().__init__()
        self.flatten = nn.Flatten()
        self.embed = nn.Linear(28 * 28, width)
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.blocks(self.embed(self.flatten(x))))


class SmallCnn(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.dropout = nn.Dropout(0.25)
        self.fc = nn.Linear(16 * 7 * 7, classes)
        self.features[0].requires_grad_(False)

    def forward(self, x):
        return self.fc(self.dropout(torch.flatten(self.features(x), 1)))


class TwoTensors(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x, y):
        return self.fc(x.flatten(1)) + y


class NoParameters(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(10))

    def forward(self, x):
        return x.flatten(1)[:, :10] * self.scale


# The models the training tests build, by file name: what Python's own code for them is.
class BadOutput(nn.Module):
    """ImageMlp whose output is not a classifier's (issue 53 items 3, 10 and 21): `kind` picks how."""

    def __init__(self, kind: str):
        super().__init__()
        self.net = ImageMlp()
        self.kind = kind

    def forward(self, x):
        y = self.net(x)
        if self.kind == "fewer_rows":
            return y[: max(1, y.shape[0] - 1)]
        if self.kind == "nan":
            return y * float("nan")
        if self.kind == "three_dims":
            return y.unsqueeze(-1).expand(-1, -1, 3)
        return y.sum(1)  # one_dim: (B,)


BAD_OUTPUTS = ["fewer_rows", "nan", "three_dims", "one_dim"]

MODELS = {"image_mlp.pt": ImageMlp, "image_mlp_traced.pt": ImageMlp, "cnn.pt": SmallCnn}


def main(out_dir):
    torch.manual_seed(0)
    model = ResidualMlp().eval()
    torch.jit.script(model).save(f"{out_dir}/residual_mlp.pt")
    x = torch.randn(5, 16)
    with torch.no_grad():
        y = model(x)
    with open(f"{out_dir}/residual_mlp_io.json", "w") as f:
        json.dump({"input": x.tolist(), "output": y.tolist(),
                   "state_dict_keys": list(model.state_dict().keys())}, f)

    for name, make in [("image_mlp.pt", lambda: torch.jit.script(ImageMlp())),
                       ("image_mlp_traced.pt", lambda: torch.jit.trace(ImageMlp(), torch.randn(3, 1, 28, 28))),
                       ("cnn.pt", lambda: torch.jit.script(SmallCnn())),
                       ("mlp16_traced.pt", lambda: torch.jit.trace(ResidualMlp(), torch.randn(3, 16))),
                       ("two_tensors.pt", lambda: torch.jit.script(TwoTensors())),
                       ("no_parameters.pt", lambda: torch.jit.script(NoParameters()))]:
        torch.manual_seed(1)
        make().save(f"{out_dir}/{name}")
    for kind in BAD_OUTPUTS:
        torch.jit.script(BadOutput(kind)).save(f"{out_dir}/bad_output_{kind}.pt")
    torch.manual_seed(1)
    torch.save(ImageMlp().state_dict(), f"{out_dir}/state_dict.pt")


if __name__ == "__main__":
    main(sys.argv[1])
