#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

namespace lockstep::models {

// The common face of the reference models: images in, class logits out. Parameter and buffer
// names equal the state_dict keys of the equivalent Python module (see docs/models.md).
class Classifier : public torch::nn::Module {
 public:
  // x: float (B, C, H, W) -> logits (B, num_classes)
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

}  // namespace lockstep::models
