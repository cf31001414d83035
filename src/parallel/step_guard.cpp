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

bool all_finite(const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  torch::Tensor total;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    torch::Tensor sum = t.sum(torch::kDouble);
    total = total.defined() ? total.add_(sum) : sum;
  }
  return !total.defined() || std::isfinite(total.item<double>());
}

}  // namespace lockstep::parallel
