#include "lockstep/models/norm_layer.h"

#include <torch/nn/modules/batchnorm.h>

namespace lockstep::models {

torch::nn::AnyModule batch_norm_2d(int64_t num_features) {
  return torch::nn::AnyModule(torch::nn::BatchNorm2d(num_features));
}

}  // namespace lockstep::models
