#include "lockstep/models/mlp.h"

namespace lockstep::models {

MLPImpl::MLPImpl(int64_t in_features, int64_t hidden, int64_t num_classes) {
  fc1 = register_module("fc1", torch::nn::Linear(in_features, hidden));
  fc2 = register_module("fc2", torch::nn::Linear(hidden, num_classes));
}

std::vector<Block> MLPImpl::blocks() {
  auto l1 = fc1.ptr(), l2 = fc2.ptr();
  return {{"fc1", {l1}, [l1](const torch::Tensor& x) { return torch::relu(l1->forward(x.flatten(1))); }},
          {"fc2", {l2}, [l2](const torch::Tensor& x) { return l2->forward(x); }}};
}

WideMLPImpl::WideMLPImpl(int64_t num_classes) {
  fc1 = register_module("fc1", torch::nn::Linear(784, 4096));
  fc2 = register_module("fc2", torch::nn::Linear(4096, 1024));
  fc3 = register_module("fc3", torch::nn::Linear(1024, num_classes));
}

std::vector<Block> WideMLPImpl::blocks() {
  auto l1 = fc1.ptr(), l2 = fc2.ptr(), l3 = fc3.ptr();
  return {{"fc1", {l1}, [l1](const torch::Tensor& x) { return torch::relu(l1->forward(x.flatten(1))); }},
          {"fc2", {l2}, [l2](const torch::Tensor& x) { return torch::relu(l2->forward(x)); }},
          {"fc3", {l3}, [l3](const torch::Tensor& x) { return l3->forward(x); }}};
}

}  // namespace lockstep::models
