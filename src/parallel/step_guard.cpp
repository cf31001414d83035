#include "lockstep/parallel/step_guard.h"

#include <torch/torch.h>

#include <cmath>

namespace lockstep::parallel {

StepGuard::StepGuard(dist::ProcessGroup* group) : group_(group) {}

void StepGuard::start_vote(double loss) {
  vote_ = torch::zeros({group_ ? group_->size() : 1}, torch::kFloat32);
  vote_.data_ptr<float>()[group_ ? group_->rank() : 0] = std::isfinite(loss) ? 0.0f : 1.0f;
  if (group_) work_ = group_->all_reduce_async(vote_);
}

std::string StepGuard::verdict(const std::vector<torch::Tensor>& gradients) {
  TORCH_CHECK(vote_.defined(), "StepGuard::verdict called without start_vote for this step");
  if (work_) group_->wait(work_, "the non-finite loss vote");
  work_.reset();
  const torch::Tensor vote = std::move(vote_);
  std::string ranks;
  for (int64_t r = 0; r < vote.numel(); ++r)
    if (vote.data_ptr<float>()[r] > 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  if (!ranks.empty()) return "non-finite loss on rank " + ranks;
  if (!all_finite(gradients)) return group_ ? "non-finite gradient (averaged over ranks)" : "non-finite gradient";
  return "";
}

// Note [Checking gradients for inf and NaN]
// A sum in the tensor's own dtype is one pass without a temporary, and it is finite only if every
// element is: NaN or inf anywhere makes it NaN or inf. The converse fails only by overflow (finite
// elements whose sum exceeds fp32's range), so a non-finite sum is confirmed element by element
// with aminmax (NaN propagates to both, inf to one). Summing in fp64 instead, as this did first,
// converts the whole tensor: for mlp-wide's 7.4M parameters that was a 59 MB temporary and
// ~13 ms of every step (perf: the top page-faulting kernel), where the fp32 sum takes ~0.4 ms.
bool all_finite(const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  for (const auto& t : tensors) {
    if (!t.defined() || std::isfinite(t.sum().item<double>())) continue;
    const auto [lo, hi] = torch::aminmax(t);
    if (!std::isfinite(lo.item<double>()) || !std::isfinite(hi.item<double>())) return false;
  }
  return true;
}

}  // namespace lockstep::parallel
