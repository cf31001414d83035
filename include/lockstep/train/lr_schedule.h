#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::train {

enum class LrScheduleKind { kConstant, kStep, kMultiStep, kCosine };
// constant, step, multistep, cosine: LrScheduleKind's names in its order (see core/names.h).
const std::vector<std::string>& lr_schedule_names();

// How --lr grows with the global batch; see scale_lr.
enum class LrScaleRule { kNone, kLinear, kSqrt };
// none, linear, sqrt: LrScaleRule's names in its order.
const std::vector<std::string>& lr_scale_rule_names();

// Steps are optimizer steps (not micro-batches, not epochs), counted from 0.
struct LrScheduleOptions {
  explicit LrScheduleOptions(double base_lr) : base_lr_(base_lr) {}
  TORCH_ARG(double, base_lr);                   // after scale_lr, if the run scales it
  TORCH_ARG(LrScheduleKind, kind) = LrScheduleKind::kConstant;
  TORCH_ARG(int64_t, total_steps) = 0;          // the whole run, warmup included; cosine needs it
  TORCH_ARG(int64_t, step_size) = 0;            // step: decay every step_size steps
  TORCH_ARG(double, gamma) = 0.1;               // step, multistep: decay factor
  TORCH_ARG(std::vector<int64_t>, milestones);  // multistep: strictly increasing, each >= 1
  TORCH_ARG(double, eta_min) = 0.0;             // cosine: lr at total_steps
  TORCH_ARG(int64_t, warmup_steps) = 0;         // linear warmup before the main schedule; 0: none
};

// The scaling rule for a larger global batch: `factor` is world size x gradient-accumulation steps;
// kLinear gives base_lr * factor (Goyal et al., 2017), kSqrt base_lr * sqrt(factor), kNone base_lr.
double scale_lr(double base_lr, LrScaleRule rule, int64_t factor);

// The learning rate as a pure function of the optimizer step, so that resuming from a checkpoint
// needs only the step count. Matches torch.optim.lr_scheduler, stepped once per optimizer step:
//   constant   base_lr                                                (no scheduler)
//   step       base_lr * gamma^floor(t / step_size)                   StepLR(step_size, gamma)
//   multistep  base_lr * gamma^(number of milestones <= t)            MultiStepLR(milestones, gamma)
//   cosine     eta_min + (base_lr - eta_min) (1 + cos(pi t / T)) / 2  CosineAnnealingLR(T, eta_min)
// With warmup W > 0 the schedule is PyTorch's
//   SequentialLR([LinearLR(start_factor=1/W, total_iters=W), main], milestones=[W]):
// lr(t) = base_lr * (1/W + (1 - 1/W) t/W) for t < W, then the main schedule with t - W for t, so
// step_size and milestones count from the end of warmup and T = total_steps - W.
// One difference: past total_steps cosine stays at eta_min, where PyTorch's would rise again.
class LrSchedule {
 public:
  // Throws c10::ValueError naming the first invalid option and what would be valid.
  explicit LrSchedule(LrScheduleOptions options);

  // The lr for the optimizer step that follows `step` steps already taken.
  double lr_at(int64_t step) const;

  // Sets lr_at(step) in every param group of `optimizer` (one base lr for all groups). Works for
  // every LibTorch optimizer: each one's options implement OptimizerOptions::set_lr.
  void apply(torch::optim::Optimizer& optimizer, int64_t step) const;

  const LrScheduleOptions& options() const { return options_; }

 private:
  double main_lr(int64_t t) const;  // the schedule after warmup, t counted from its end

  LrScheduleOptions options_;
};

}  // namespace lockstep::train
