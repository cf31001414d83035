#include "lockstep/models/mlp.h"

namespace lockstep::models {

MLPImpl::MLPImpl(int64_t in_features, int64_t hidden, int64_t num_classes) {
  fc1 = register_module("fc1", torch::nn::Linear(in_features, hidden));
  fc2 = register_module("fc2", torch::nn::Linear(hidden, num_classes));
}

torch::Tensor MLPImpl::forward(torch::Tensor x) {
  return fc2->forward(torch::relu(fc1->forward(x.flatten(1))));
}

}  // namespace lockstep::models
