#pragma once
// What the example tests read back: the weights an example saved, and how far apart two sets are.
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <string>

#include "lockstep/core/atomic_file.h"

namespace lockstep::testing {

// A state dict saved by save_state_dict (or torch.save), by key.
inline std::map<std::string, torch::Tensor> saved_weights(const std::string& path) {
  std::map<std::string, torch::Tensor> weights;
  for (const auto& e : torch::pickle_load(read_file(path)).toGenericDict())
    weights.emplace(e.key().toStringRef(), e.value().toTensor());
  return weights;
}

// The largest |a - b| over every tensor of `a` (in double), each compared with b's of the same key.
inline double max_abs_difference(const std::map<std::string, torch::Tensor>& a,
                                 const std::map<std::string, torch::Tensor>& b) {
  double worst = 0.0;
  for (const auto& [name, t] : a)
    worst = std::max(worst, (b.at(name).to(torch::kDouble) - t.to(torch::kDouble)).abs().max().item<double>());
  return worst;
}

}  // namespace lockstep::testing
