#include "lockstep/models/classifier.h"

#include <torch/torch.h>

#include <algorithm>
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

void check_logits(const torch::Tensor& logits, const torch::Tensor& batch, int64_t min_classes,
                  const std::string& model, const std::string& data) {
  min_classes = std::max<int64_t>(1, min_classes);
  TORCH_CHECK_VALUE(logits.dim() == 2 && logits.size(0) == batch.size(0) && logits.size(1) >= min_classes, model,
                    " returns shape ", logits.sizes(), " for a batch of shape ", batch.sizes(), " of ", data,
                    ": a classifier returns logits (batch, classes), one row per sample, with at least ",
                    min_classes, min_classes == 1 ? " class" : " classes");
  if (!logits.is_floating_point()) return;
  const torch::Tensor finite = torch::isfinite(logits);
  if (finite.all().item<bool>()) return;
  const torch::Tensor first = (~finite).nonzero()[0];
  TORCH_CHECK_VALUE(false, model, " returns ", (~finite).sum().item<int64_t>(), " non-finite logits (NaN or inf) of ",
                    logits.numel(), " for a batch of shape ", batch.sizes(), " of ", data, ", the first at sample ",
                    first[0].item<int64_t>(), ", class ", first[1].item<int64_t>(), " (",
                    logits.index({first[0], first[1]}).item<double>(),
                    "); its weights or its forward produce them, so its predictions would be meaningless");
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
