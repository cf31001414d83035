#include "lockstep/models/state_dict.h"

#include <torch/serialize.h>

#include "lockstep/core/atomic_file.h"

namespace lockstep::models {

std::vector<std::pair<std::string, torch::Tensor>> state_dict(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false))
      out.emplace_back(prefix + p.key(), p.value());
    for (const auto& b : item.value()->named_buffers(/*recurse=*/false))
      out.emplace_back(prefix + b.key(), b.value());
  }
  return out;
}

void save_state_dict(const torch::nn::Module& model, const std::string& path) {
  c10::Dict<std::string, torch::Tensor> dict;  // keeps insertion order, as Python's OrderedDict
  for (auto& [key, tensor] : state_dict(model)) dict.insert(key, tensor.detach().cpu());
  write_file_atomic(path, torch::pickle_save(dict));
}

}  // namespace lockstep::models
