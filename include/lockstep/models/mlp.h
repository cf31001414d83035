#pragma once

#include <torch/nn.h>

#include "lockstep/models/classifier.h"

namespace lockstep::models {

// Flatten, Linear(784, 256), ReLU, Linear(256, num_classes): no batch norm, so its result does not
// depend on how a batch is split across ranks (the model of the exactness tests).
// Keys: fc1.weight, fc1.bias, fc2.weight, fc2.bias.
class MLPImpl : public Classifier {
 public:
  explicit MLPImpl(int64_t in_features = 784, int64_t hidden = 256, int64_t num_classes = 10);
  // fc1 (flatten, fc1, ReLU), fc2; see Note [Model blocks].
  std::vector<Block> blocks() override;

  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(MLP);

// Flatten, Linear(784, 4096), ReLU, Linear(4096, 1024), ReLU, Linear(1024, num_classes): 7.4M
// parameters (29.7 MB of fp32 gradients per step) and little arithmetic per sample, so at small
// batches a DDP step is bound by the gradient all-reduce, not by compute. The peer's WideMLP
// (../shared/peer/fmnist_ddp.py --model mlp-wide), layer for layer.
// Keys: fc1.weight, fc1.bias, fc2.weight, fc2.bias, fc3.weight, fc3.bias.
class WideMLPImpl : public Classifier {
 public:
  explicit WideMLPImpl(int64_t num_classes = 10);
  // fc1 (flatten, fc1, ReLU), fc2 (fc2, ReLU), fc3; see Note [Model blocks].
  std::vector<Block> blocks() override;

  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(WideMLP);

}  // namespace lockstep::models
