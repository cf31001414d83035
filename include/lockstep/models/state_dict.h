#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

namespace lockstep::models {

// Parameters and buffers by state_dict key, in the order Python's model.state_dict() lists them
// (module by module: its parameters, then its buffers).
std::vector<std::pair<std::string, torch::Tensor>> state_dict(const torch::nn::Module& model);

// state_dict(model) as CPU tensors in an insertion-ordered dict (Python's OrderedDict when pickled).
c10::Dict<std::string, torch::Tensor> state_dict_to_dict(const torch::nn::Module& model);

// Writes state_dict(model) (as CPU tensors) atomically to `path` in PyTorch's zip format:
// Python's torch.load(path) returns a dict key -> tensor that load_state_dict accepts.
void save_state_dict(const torch::nn::Module& model, const std::string& path);
// The same for a dict already made (e.g. state_dict_to_dict with some tensors replaced).
void save_state_dict(const c10::Dict<std::string, torch::Tensor>& dict, const std::string& path);

// Copies `dict` (str -> Tensor) into the model's parameters and buffers, strictly, as Python's
// model.load_state_dict(dict): every key must match, shapes must agree; dtypes are converted.
// A "module." prefix on every key (a state dict saved from a DDP-wrapped model) is accepted.
// Throws c10::Error listing missing and unexpected keys or the first shape mismatch; `source`
// names where the dict came from in the message.
void load_state_dict(torch::nn::Module& model, const c10::IValue& dict, const std::string& source);

// load_state_dict from a file written by save_state_dict or by Python's
// torch.save(model.state_dict(), path).
void load_state_dict_file(torch::nn::Module& model, const std::string& path);

}  // namespace lockstep::models
