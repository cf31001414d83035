#!/usr/bin/env python3
"""Models defined in Python, saved as TorchScript for lockstep to serve (tests/serve/torchscript_serve_test.cpp).

Usage: torchscript_models.py OUT_DIR
Writes OUT_DIR/residual_mlp.pt (torch.jit.script of a residual MLP with LayerNorm and GELU, in
eval mode) and OUT_DIR/residual_mlp_io.json: a batch of inputs and the module's outputs for them,
as Python computes them.
"""
import json
import sys

import torch


class Block(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc1 = torch.nn.Linear(width, 2 * width)
        self.fc2 = torch.nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class ResidualMlp(torch.nn.Module):
    def __init__(self, inputs: int = 16, width: int = 32, outputs: int = 4):
        super().__init__()
        self.embed = torch.nn.Linear(inputs, width)
        self.blocks = torch.nn.Sequential(Block(width), Block(width))
        self.head = torch.nn.Linear(width, outputs)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x)))


def main(out_dir):
    torch.manual_seed(0)
    model = ResidualMlp().eval()
    scripted = torch.jit.script(model)
    scripted.save(f"{out_dir}/residual_mlp.pt")
    x = torch.randn(5, 16)
    with torch.no_grad():
        y = model(x)
    with open(f"{out_dir}/residual_mlp_io.json", "w") as f:
        json.dump({"input": x.tolist(), "output": y.tolist(),
                   "state_dict_keys": list(model.state_dict().keys())}, f)


if __name__ == "__main__":
    main(sys.argv[1])
