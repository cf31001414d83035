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

}  // namespace lockstep::models
