"""ONNX Runtime's side of bench/inference.sh: per-batch latency of an exported model in PyPI's
onnxruntime (the venv's, installed by scripts/bootstrap --test).

Usage: python bench/inference_ort.py MODEL.onnx C,H,W BATCH THREADS BATCHES [WARMUP=2]
Prints one JSON line: p50/p90/p99/mean latency per batch (ms, nearest rank) and samples/s, the same
figures `lockstep predict --json` gives for LibTorch.
"""
import json
import math
import sys
import time

import numpy as np
import onnxruntime as ort


def percentile(ordered, q):
    rank = math.ceil(q * len(ordered))
    return ordered[min(len(ordered) - 1, max(rank, 1) - 1)]


def main():
    if len(sys.argv) not in (6, 7):
        sys.exit("usage: python bench/inference_ort.py MODEL.onnx C,H,W BATCH THREADS BATCHES [WARMUP]")
    model, shape = sys.argv[1], [int(d) for d in sys.argv[2].split(",")]
    batch, threads, batches = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    warmup = int(sys.argv[6]) if len(sys.argv) == 7 else 2
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feeds = {session.get_inputs()[0].name: np.random.uniform(-1, 1, [batch] + shape).astype(np.float32)}
    latencies = []
    for i in range(warmup + batches):
        start = time.perf_counter()
        session.run(None, feeds)
        ms = (time.perf_counter() - start) * 1e3
        if i >= warmup:
            latencies.append(ms)
    total = sum(latencies)
    latencies.sort()
    print(json.dumps({
        "latency_ms": {"p50": percentile(latencies, 0.5), "p90": percentile(latencies, 0.9),
                       "p99": percentile(latencies, 0.99), "mean": total / len(latencies),
                       "timed_batches": len(latencies)},
        "throughput_samples_per_s": len(latencies) * batch * 1000 / total,
    }))


if __name__ == "__main__":
    main()
