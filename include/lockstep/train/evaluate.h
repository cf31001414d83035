#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>

#include "lockstep/data/dataset.h"
#include "lockstep/dist/process_group.h"

namespace lockstep::train {

// Logits (B, classes) for a batch of inputs.
using ForwardFunction = std::function<torch::Tensor(const torch::Tensor& input)>;

// The fraction of `dataset` that `forward` classifies correctly (argmax of its logits equals the
// label), with `module` in eval mode (restored to its previous mode after) and without autograd,
// `batch_size` samples at a time. With a group, each rank scores a contiguous share of the data
// set and the counts are summed, so every rank returns the same fraction.
double evaluate(torch::nn::Module& module, const ForwardFunction& forward, const data::Dataset& dataset,
                dist::ProcessGroup* group = nullptr, int64_t batch_size = 200);

}  // namespace lockstep::train
