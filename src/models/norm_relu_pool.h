#pragma once

#include <torch/nn.h>

namespace lockstep::models {

// A train-mode BatchNorm2d, ReLU and MaxPool2d(2) as one autograd function: see Note [BatchNorm,
// ReLU and the max-pool as one function in training] (norm_relu_pool.cpp).

// Whether norm_relu_pool_train() can run `norm` on x: a CPU with AVX2 and FMA; `norm` a
// BatchNorm2d or a SyncBatchNorm (SumsOverRanks; no other subclass, whose forward is its own) in
// train mode with fp32 parameters and statistics; x (N, C, H, W) fp32 or bf16 (autocast's
// convolution output) on the CPU, contiguous NCHW, H and W even and positive; for a BatchNorm2d
// more than one value per channel (a SyncBatchNorm's batch is checked across the ranks).
bool norm_relu_pool_trains(const torch::nn::BatchNorm2dImpl& norm, const torch::Tensor& x);

// MaxPool2d(2)(ReLU(norm(x))) with the values, gradients and running-statistics updates of
// LibTorch's three modules, within float rounding: x (N, C, H, W) -> (N, C, H/2, W/2), x's dtype,
// NCHW.
// Updates `norm`'s running statistics and num_batches_tracked as BatchNorm2d's forward does; a
// SyncBatchNorm normalises over every rank's batch, as its own forward does.
torch::Tensor norm_relu_pool_train(torch::nn::BatchNorm2dImpl& norm, const torch::Tensor& x);

}  // namespace lockstep::models
