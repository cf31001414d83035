#include "lockstep/models/classifier.h"

#include <unordered_set>

namespace lockstep::models {
namespace {

std::vector<torch::Tensor> unique(const std::vector<torch::Tensor>& tensors, std::unordered_set<void*>& seen) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors)
    if (seen.insert(t.unsafeGetTensorImpl()).second) out.push_back(t);
  return out;
}

}  // namespace

torch::Tensor Classifier::forward(torch::Tensor x) {
  for (const Block& block : blocks()) x = run_block(block, x);
  return x;
}

std::vector<torch::Tensor> block_parameters(const Block& block) {
  std::unordered_set<void*> seen;
  std::vector<torch::Tensor> out;
  for (const auto& m : block.modules)
    for (auto& t : unique(m->parameters(), seen)) out.push_back(t);
  return out;
}

std::vector<torch::Tensor> block_buffers(const Block& block) {
  std::unordered_set<void*> seen;
  std::vector<torch::Tensor> out;
  for (const auto& m : block.modules)
    for (auto& t : unique(m->buffers(), seen)) out.push_back(t);
  return out;
}

}  // namespace lockstep::models
