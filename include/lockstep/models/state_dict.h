#pragma once

#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

namespace lockstep::models {

// Parameters and buffers by state_dict key, in the order Python's model.state_dict() lists them
// (module by module: its parameters, then its buffers).
std::vector<std::pair<std::string, torch::Tensor>> state_dict(const torch::nn::Module& model);

// Writes state_dict(model) (as CPU tensors) atomically to `path` in PyTorch's zip format:
// Python's torch.load(path) returns a dict key -> tensor that load_state_dict accepts.
void save_state_dict(const torch::nn::Module& model, const std::string& path);

}  // namespace lockstep::models
