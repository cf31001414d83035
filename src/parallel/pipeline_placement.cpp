#include "lockstep/parallel/pipeline_placement.h"

#include <c10/util/StringUtil.h>
#include <torch/csrc/utils/tensor_flatten.h>
#include <torch/torch.h>

#include <algorithm>
#include <unordered_map>

namespace lockstep::parallel {

std::vector<ParameterPlacement> place_parameters(const std::vector<models::Block>& blocks,
                                                 const std::vector<int64_t>& boundaries,
                                                 const std::vector<torch::Tensor>& parameters) {
  const auto n = static_cast<int64_t>(blocks.size());
  TORCH_CHECK(boundaries.size() >= 2 && boundaries.front() == 0 && boundaries.back() == n,
              "stage boundaries must run from block 0 to the model's ", n, " blocks");
  std::vector<ParameterPlacement> placement;
  std::unordered_map<const c10::TensorImpl*, size_t> seen;  // parameter -> its entry in placement
  int64_t stage = 0;
  for (int64_t b = 0; b < n; ++b) {
    while (b >= boundaries[stage + 1]) ++stage;
    for (const auto& t : models::block_parameters(blocks[b])) {
      auto it = seen.find(t.unsafeGetTensorImpl());
      if (it != seen.end()) {  // shared with an earlier block: see Note [Tied weights across stages]
        std::vector<int64_t>& stages = placement[it->second].stages;
        if (stages.back() != stage) stages.push_back(stage);
        continue;
      }
      const auto index = static_cast<int64_t>(placement.size());
      TORCH_CHECK(index < static_cast<int64_t>(parameters.size()) && parameters[index].is_same(t), "block '",
                  blocks[b].name, "' lists its parameters out of the model's order: a block's new parameters must ",
                  "follow the modules' registration (a parameter an earlier block listed may come again)");
      seen.emplace(t.unsafeGetTensorImpl(), placement.size());
      placement.push_back({t, index, {stage}});
    }
  }
  TORCH_CHECK(placement.size() == parameters.size(), "the model's blocks use ", placement.size(), " of its ",
              parameters.size(), " parameters: every parameter must belong to a block");
  return placement;
}

std::vector<torch::Tensor> StageParameters::all() const {
  std::vector<torch::Tensor> out = owned;
  out.insert(out.end(), tied.begin(), tied.end());
  return out;
}

std::vector<int64_t> StageParameters::model_indices() const {
  std::vector<int64_t> out;
  for (int64_t j = 0; j < static_cast<int64_t>(owned.size()); ++j) out.push_back(first_owned + j);
  out.insert(out.end(), tied_indices.begin(), tied_indices.end());
  return out;
}

StageParameters stage_parameters(const std::vector<ParameterPlacement>& placement, int64_t stage) {
  StageParameters s;
  for (const auto& p : placement) {
    const int64_t owner = p.stages.front();
    if (owner < stage) ++s.first_owned;  // owners ascend with the model index (blocks run in order)
    if (owner == stage) {
      s.owned.push_back(p.parameter);
    } else if (std::find(p.stages.begin() + 1, p.stages.end(), stage) != p.stages.end()) {
      s.tied.push_back(p.parameter);
      s.tied_indices.push_back(p.index);
    }
  }
  return s;
}

TiedGradients::TiedGradients(const std::vector<ParameterPlacement>& placement, int64_t stages,
                             dist::ProcessGroup* group) {
  std::vector<std::vector<int64_t>> sets;  // the sets of stages that share a weight, in model order
  for (const auto& p : placement)
    if (p.stages.size() > 1 && std::find(sets.begin(), sets.end(), p.stages) == sets.end()) sets.push_back(p.stages);
  if (sets.empty()) return;
  TORCH_CHECK(group != nullptr && group->size() % stages == 0, "a weight shared by stages ", c10::Join(", ", sets[0]),
              " needs a process group of a multiple of ", stages, " ranks");
  // See Note [Pipeline replicas]: every rank makes every group, keeping its own.
  const int64_t replicas = group->size() / stages;
  for (const auto& set : sets)
    for (int64_t r = 0; r < replicas; ++r) {
      std::vector<int64_t> ranks;
      for (int64_t s : set) ranks.push_back(r * stages + s);
      std::unique_ptr<dist::ProcessGroup> sub = group->new_group(ranks);
      if (!sub) continue;
      Tie tie{std::move(sub), {}};
      for (const auto& p : placement)
        if (p.stages == set) tie.parameters.push_back(p.parameter);
      ties_.push_back(std::move(tie));
    }
}

TiedGradients::~TiedGradients() = default;

void TiedGradients::sum() {
  torch::NoGradGuard no_grad;
  for (Tie& tie : ties_) {
    std::vector<torch::Tensor> grads;
    for (auto& p : tie.parameters) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      grads.push_back(p.grad());
    }
    torch::Tensor flat = torch::utils::flatten_dense_tensors(grads);
    tie.group->all_reduce(flat, dist::ReduceOp::kSum);
    const std::vector<torch::Tensor> summed = torch::utils::unflatten_dense_tensors(flat, grads);
    for (size_t i = 0; i < grads.size(); ++i) grads[i].copy_(summed[i]);
  }
}

int64_t TiedGradients::count() const {
  int64_t n = 0;
  for (const Tie& tie : ties_) n += static_cast<int64_t>(tie.parameters.size());
  return n;
}

}  // namespace lockstep::parallel
