#!/usr/bin/env python3
"""TorchScript models with several typed inputs and outputs, for lockstep serve to answer as Triton's
PyTorch backend would (tests/serve/torchscript_repository_test.cpp).

Usage: torchscript_serving_models.py OUT_DIR
Writes, each saved with torch.jit.save(torch.jit.script(model)) in eval mode:
  two_input.pt    forward(image (B,1,28,28) fp32, features (B,8) fp32) -> (logits (B,10) fp32, class (B,1) int64)
  embedding.pt    forward(indices (2,6) int64, mask (2,6) bool)         -> (mean (2,4) fp32, count (2) int64,
                                                                           any (2) bool)   no batch dimension
  casts.pt        forward(half (B,3) fp16, bf (B,3) bf16, count (B,3) int32) -> (fp16, bf16, int32)
  scalar_arg.pt   forward(x Tensor, k: int): an argument that is not a tensor
  image_classifier.pt  forward(image (B,1,28,28) fp32) -> logits (B,10) (for lockstep predict --model-file)
and OUT_DIR/io.json: for each model the inputs sent and the outputs Python computes for them
(fp16/bf16 values as floats).
"""
import json
import sys

import torch


class TwoInput(torch.nn.Module):
    """An image and a feature vector: a conv branch and a linear branch, joined."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 5, stride=2)
        self.norm = torch.nn.BatchNorm2d(4)
        self.vector = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(4 * 12 * 12 + 16, 10)

    def forward(self, image: torch.Tensor, features: torch.Tensor):
        x = torch.relu(self.norm(self.conv(image))).flatten(1)
        v = torch.tanh(self.vector(features))
        logits = self.head(torch.cat([x, v], dim=1))
        return logits, logits.argmax(dim=1, keepdim=True)


class Embedding(torch.nn.Module):
    """Mean of the embeddings of the tokens the mask keeps, per sequence."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 4)

    def forward(self, indices: torch.Tensor, mask: torch.Tensor):
        kept = mask.unsqueeze(-1).to(torch.float32)
        count = mask.sum(dim=1)
        mean = (self.embed(indices) * kept).sum(dim=1) / count.clamp(min=1).unsqueeze(-1).to(torch.float32)
        return mean, count, mask.any(dim=1)


class Casts(torch.nn.Module):
    def forward(self, half: torch.Tensor, bf: torch.Tensor, count: torch.Tensor):
        return [half * 2 + 1, bf * bf, count * 3 - 1]


class ImageClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 3, stride=2)
        self.head = torch.nn.Linear(8 * 13 * 13, 10)

    def forward(self, image: torch.Tensor):
        return self.head(torch.relu(self.conv(image)).flatten(1))


class ScalarArg(torch.nn.Module):
    def forward(self, x: torch.Tensor, k: int):
        return x * k


def floats(t):
    return t.to(torch.float32).tolist() if t.is_floating_point() else t.tolist()


def main(out_dir):
    torch.manual_seed(0)
    two_input = TwoInput()
    two_input.train()
    with torch.no_grad():  # move BatchNorm's running statistics off their defaults
        for _ in range(3):
            two_input(torch.randn(16, 1, 28, 28) + 0.5, torch.randn(16, 8))
    models = {"two_input": two_input.eval(), "embedding": Embedding().eval(), "casts": Casts().eval()}
    inputs = {
        "two_input": [torch.randn(5, 1, 28, 28), torch.randn(5, 8)],
        "embedding": [torch.tensor([[3, 7, 7, 19, 0, 2], [5, 1, 0, 0, 0, 0]]),
                      torch.tensor([[True, True, False, True, True, False], [True, True, False, False, False, False]])],
        "casts": [torch.tensor([[0.5, -1.25, 3.0], [100.0, 0.125, -7.5]], dtype=torch.float16),
                  torch.tensor([[1.5, -2.0, 0.25], [3.0, 10.0, -0.5]], dtype=torch.bfloat16),
                  torch.tensor([[1, -2, 3], [2147483, 0, -7]], dtype=torch.int32)],
    }
    io = {}
    for name, model in models.items():
        torch.jit.script(model).save(f"{out_dir}/{name}.pt")
        with torch.no_grad():
            outputs = model(*inputs[name])
        io[name] = {"inputs": [floats(t) for t in inputs[name]], "outputs": [floats(t) for t in outputs],
                    "output_dtypes": [str(t.dtype) for t in outputs]}
    torch.jit.script(ScalarArg()).save(f"{out_dir}/scalar_arg.pt")
    torch.jit.script(ImageClassifier().eval()).save(f"{out_dir}/image_classifier.pt")
    with open(f"{out_dir}/io.json", "w") as f:
        json.dump(io, f)


if __name__ == "__main__":
    main(sys.argv[1])
