#pragma once

#include <torch/optim/sgd.h>

namespace lockstep::optim {

// Note [SGD in one pass]
// LibTorch's SGD (as Python's torch.optim.SGD without foreach) makes three passes over each
// parameter-sized tensor for a step with momentum: buf *= momentum, buf += grad, p -= lr * buf,
// reading eight and writing three tensors' worth of memory where one pass reads three (p, grad,
// buf) and writes two. For mlp-wide (7.4M parameters, memory-bound at small batches) the step was
// 8.5 of a 24 ms training step in one process and 12.5 of 47 under DDP, where both ranks step at
// once on the cores' shared memory bandwidth.
//
// FusedSGD is torch::optim::SGD (the same options, state, save and load) whose step() makes that
// one pass wherever it can: an fp32 CPU parameter with a dense contiguous gradient and a
// contiguous momentum buffer (from the second step on; the first step creates the buffer as
// LibTorch does), on a CPU with AVX2 and FMA. Each element gets the same operations in the same
// order as LibTorch's vectorised kernels give it (a product, then fused multiply-adds), so the
// values are LibTorch's; every other parameter takes LibTorch's operators, in LibTorch's order.
class FusedSGD : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace lockstep::optim
