"""Batch-1 latency of the convnet in PyTorch's own inference variants, and of each of its layers.

What a frozen or optimized graph, oneDNN's layout or channels-last would buy LibTorch at batch 1,
measured in Python on the same module (tests/python/reference_models.py, the one lockstep's convnet
matches key for key), one intra-op thread, inference mode, random weights (latency does not depend
on them): the median of 3000 timed calls after 200 warm-up calls. Compare with bench/inference.sh,
which times lockstep's own forward and ONNX Runtime's on the same machine.

Usage: .venv/bin/python bench/inference_variants.py
"""
import copy
import os
import statistics
import sys
import time

import torch
from torch.utils import mkldnn as mkldnn_utils

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from reference_models import ConvNet  # noqa: E402


def median_ms(f, arg, calls=3000, warmup=200):
    with torch.inference_mode():
        for _ in range(warmup):
            f(arg)
        times = []
        for _ in range(calls):
            t = time.perf_counter()
            f(arg)
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main():
    torch.set_num_threads(1)
    model = ConvNet().eval()
    x = torch.randn(1, 1, 28, 28)
    with torch.no_grad():
        traced = torch.jit.trace(model, x)
        frozen = torch.jit.freeze(torch.jit.script(model))
        optimized = torch.jit.optimize_for_inference(torch.jit.script(model))
    on_mkldnn = mkldnn_utils.to_mkldnn(copy.deepcopy(model))
    channels_last = copy.deepcopy(model).to(memory_format=torch.channels_last)
    variants = [
        ("eager", model),
        ("torch.jit.trace", traced),
        ("torch.jit.freeze (conv-bn folded)", frozen),
        ("torch.jit.optimize_for_inference", optimized),
        ("to_mkldnn (oneDNN layout throughout)", lambda t: on_mkldnn(t.to_mkldnn()).to_dense()),
        ("channels_last", lambda t: channels_last(t.contiguous(memory_format=torch.channels_last))),
    ]
    print("| variant | batch-1 ms (median) |")
    print("|---|---|")
    for name, f in variants:
        print("| %s | %.4f |" % (name, median_ms(f, x)))

    with torch.inference_mode():
        a1 = model.layer1[0](x)
        a2 = model.layer1(x)
        a3 = model.layer2[0](a2)
        a4 = model.layer2(a2).flatten(1)
    layers = [("conv1 (1->16, 5x5 on 28x28)", model.layer1[0], x), ("bn1", model.layer1[1], a1),
              ("relu1", model.layer1[2], a1), ("maxpool1", model.layer1[3], a1),
              ("conv2 (16->32, 5x5 on 14x14)", model.layer2[0], a2), ("bn2", model.layer2[1], a3),
              ("relu2", model.layer2[2], a3), ("maxpool2", model.layer2[3], a3), ("fc (1568->10)", model.fc, a4),
              ("x.clone() (one op's dispatch)", lambda t: t.clone(), x)]
    print()
    print("| layer, eager, batch 1 | ms (median) |")
    print("|---|---|")
    for name, f, arg in layers:
        print("| %s | %.4f |" % (name, median_ms(f, arg)))


if __name__ == "__main__":
    main()
