#pragma once

#include <torch/nn/modules/container/any.h>

#include <cstdint>
#include <functional>
#include <string>

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

// A BatchNorm whose training statistics cover several processes' batches (parallel::SyncBatchNorm).
// A model's own training path for its norm layers (the convnet's BatchNorm, ReLU and max-pool as
// one function) finds it with dynamic_cast and calls sum_over_ranks where the layer's forward and
// backward all-reduce, with the same values in the same order, so that ranks taking either path
// pair up.
class SumsOverRanks {
 public:
  virtual ~SumsOverRanks() = default;
  // Sums `values` (K) fp64 over the ranks, in place. Every rank calls it in the same order.
  virtual void sum_over_ranks(torch::Tensor& values) const = 0;
  // "rank R of W", for errors.
  virtual std::string rank_description() const = 0;
};

}  // namespace lockstep::models
