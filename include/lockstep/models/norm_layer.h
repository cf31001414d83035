#pragma once

#include <torch/nn/modules/container/any.h>

#include <cstdint>
#include <functional>

namespace lockstep::models {

// Note [Norm layer factory]: torchvision's `norm_layer`. The reference models build each of their
// normalisation layers by calling a NormLayer with its channel count, and call it through the
// AnyModule it returns, so a model built with parallel::sync_batch_norm_layer(group) runs
// SyncBatchNorm where it would run BatchNorm2d. Swapping layers after construction cannot do
// this in LibTorch: Module::replace_module updates neither a parent's typed member nor (for the
// forward) a Sequential's list. The state-dict keys do not depend on the factory.
using NormLayer = std::function<torch::nn::AnyModule(int64_t num_features)>;

// BatchNorm2d(num_features) with PyTorch's defaults: the reference models' default norm layer.
torch::nn::AnyModule batch_norm_2d(int64_t num_features);

}  // namespace lockstep::models
