#include "lockstep/parallel/shard_step.h"

#include <torch/torch.h>

#include <cmath>
#include <string>

namespace lockstep::parallel {
namespace {

// Each rank's squared shard norm in its slot, summed over ranks by one all-reduce: (N) fp64. The
// norms are fp32, as clip_grad_norm_ computes them.
torch::Tensor squared_shard_norms(dist::ProcessGroup& group, const std::vector<torch::Tensor>& grad_shards) {
  torch::Tensor squares = torch::zeros({group.size()}, torch::kDouble);
  double mine = 0.0;
  for (const torch::Tensor& g : grad_shards) mine += std::pow(g.norm().item<double>(), 2);
  squares[group.rank()] = mine;
  group.all_reduce(squares);
  return squares;
}

}  // namespace

dist::ProcessGroup& sharding_group(const StrategyOptions& options, const std::string& name, const std::string& shards) {
  TORCH_CHECK_VALUE(options.group() != nullptr, "the ", name, " strategy shards ", shards,
                    " across ranks and needs a process group: StrategyOptions().group(...), with the program started "
                    "under a launcher; one process trains with the local strategy");
  const amp::OptLevel level = options.opt_level();
  TORCH_CHECK_VALUE(level == amp::OptLevel::kO0 || level == amp::OptLevel::kO1, "rank ", options.group()->rank(),
                    ": the ", name, " strategy trains at O0 (fp32) and O1 (autocast), not ", amp::to_string(level),
                    ": set StrategyOptions::opt_level O1, or use the ddp strategy for O2 and O3");
  return *options.group();
}

// See Note [Stepping shards].
StepDecision step_shards(StepGuard& guard, amp::Amp& amp, dist::ProcessGroup& group, const StrategyOptions& options,
                         const std::vector<torch::Tensor>& grad_shards) {
  StepDecision d;
  d.skip_reason = guard.verdict({});  // the losses; the gradient is checked over every shard below
  if (!d.skip_reason.empty()) return d;
  const bool scaling = amp.grad_scaler().is_enabled();  // the scaler checks the shards itself
  double norm = NAN;  // of the whole model's gradient
  if (!scaling) {
    const torch::Tensor squares = squared_shard_norms(group, grad_shards);
    std::string ranks;
    for (int64_t r = 0; r < group.size(); ++r)
      if (!std::isfinite(squares[r].item<double>())) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    if (!ranks.empty()) {
      d.skip_reason = "non-finite gradient (averaged over ranks) in the shard of rank " + ranks;
      return d;
    }
    norm = std::sqrt(squares.sum().item<double>());
  }
  if (options.clip_value() > 0 || options.clip_norm() > 0) {
    torch::NoGradGuard no_grad;
    amp.unscale_();  // clip true gradients
    if (options.clip_value() > 0)
      for (const torch::Tensor& g : grad_shards) g.clamp_(-options.clip_value(), options.clip_value());
    if (options.clip_norm() > 0) {
      if (scaling || options.clip_value() > 0) norm = std::sqrt(squared_shard_norms(group, grad_shards).sum().item<double>());
      // As torch.nn.utils.clip_grad_norm_, over the whole model's gradient.
      const double coefficient = options.clip_norm() / (norm + 1e-6);
      if (coefficient < 1.0)
        for (const torch::Tensor& g : grad_shards) g.mul_(coefficient);
    }
  }
  d.stepped = amp.step();
  if (options.fixed_loss_scale()) {
    amp.grad_scaler().update(options.loss_scale()->init_scale());
  } else {
    amp.update();
  }
  if (!d.stepped) d.skip_reason = "non-finite gradient (loss scale overflow)";
  return d;
}

}  // namespace lockstep::parallel
