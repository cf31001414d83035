"""The real Triton server as a serving peer: PyTriton (nvidia-pytriton 0.7, whose wheel carries
Triton's own `tritonserver` binary) serving a TorchScript file through a Python callable, with
Triton's dynamic batcher in front of it. This is how a Python user puts a PyTorch model behind
Triton without writing a backend: Triton's C++ HTTP/gRPC front end, batcher and Python backend,
the forward in this process (torch.jit.load, inference_mode, one forward per batch Triton forms).

Needs: bench/peers_env.sh (.venv-peers: nvidia-pytriton with numpy < 2, torch from the project's venv)
Run:   .venv-peers/bin/python bench/triton_peer.py --model model.pt --http-port P --grpc-port Q
         --metrics-port R [--threads 1] [--max-batch-size 64]
Then:  the KServe v2 protocol on both ports: model "convnet", input "input" FP32 (-1,1,28,28),
       output "logits" FP32 (-1,10)."""
import argparse

import numpy as np
import torch
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help="a TorchScript file (torch.jit.save)")
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--metrics-port", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-batch-size", type=int, default=64)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    net = torch.jit.load(a.model).eval()

    @batch
    def infer(input):  # input: (B,1,28,28) float32, B as Triton's batcher formed it
        with torch.inference_mode():
            return {"logits": net(torch.from_numpy(input)).numpy()}

    config = TritonConfig(http_address="127.0.0.1", http_port=a.http_port, grpc_address="127.0.0.1",
                          grpc_port=a.grpc_port, metrics_port=a.metrics_port, allow_gpu_metrics=False)
    with Triton(config=config) as triton:
        triton.bind(model_name="convnet", infer_func=infer,
                    inputs=[Tensor(name="input", dtype=np.float32, shape=(1, 28, 28))],
                    outputs=[Tensor(name="logits", dtype=np.float32, shape=(10,))],
                    config=ModelConfig(max_batch_size=a.max_batch_size,
                                       batcher=DynamicBatcher(max_queue_delay_microseconds=0)))
        triton.serve()


if __name__ == "__main__":
    main()
