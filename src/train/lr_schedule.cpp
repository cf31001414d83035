#include "lockstep/train/lr_schedule.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>

#include "lockstep/core/names.h"

namespace lockstep::train {

const std::vector<std::string>& lr_schedule_names() {
  static const std::vector<std::string> names{"constant", "step", "multistep", "cosine"};
  return names;
}

const std::vector<std::string>& lr_scale_rule_names() {
  static const std::vector<std::string> names{"none", "linear", "sqrt"};
  return names;
}

double scale_lr(double base_lr, LrScaleRule rule, int64_t factor) {
  TORCH_CHECK_VALUE(factor >= 1, "scale_lr: factor=", factor,
                    " must be at least 1 (world size x gradient-accumulation steps)");
  if (rule == LrScaleRule::kLinear) return base_lr * static_cast<double>(factor);
  if (rule == LrScaleRule::kSqrt) return base_lr * std::sqrt(static_cast<double>(factor));
  return base_lr;
}

LrSchedule::LrSchedule(LrScheduleOptions options) : options_(std::move(options)) {
  const LrScheduleOptions& o = options_;
  const LrScheduleKind kind = o.kind();
  const std::string& name = enum_name(lr_schedule_names(), kind);
  TORCH_CHECK_VALUE(std::isfinite(o.base_lr()) && o.base_lr() >= 0, "LrSchedule: base_lr=",
                    o.base_lr(), " must be a finite number >= 0");
  TORCH_CHECK_VALUE(o.warmup_steps() >= 0, "LrSchedule: warmup_steps=", o.warmup_steps(),
                    " must be >= 0 (0 turns warmup off)");
  if (kind == LrScheduleKind::kStep || kind == LrScheduleKind::kMultiStep) {
    TORCH_CHECK_VALUE(std::isfinite(o.gamma()) && o.gamma() > 0, "LrSchedule: gamma=", o.gamma(),
                      " must be > 0 for kind '", name, "' (0.1 divides the lr by 10 at each decay)");
  }
  if (kind == LrScheduleKind::kStep) {
    TORCH_CHECK_VALUE(o.step_size() >= 1, "LrSchedule: step_size=", o.step_size(),
                      " must be >= 1 for kind 'step': the number of optimizer steps between decays");
  }
  if (kind == LrScheduleKind::kMultiStep) {
    const std::vector<int64_t>& m = o.milestones();
    TORCH_CHECK_VALUE(!m.empty(), "LrSchedule: kind 'multistep' needs milestones (optimizer steps "
                      "after warmup at which the lr is multiplied by gamma); for a fixed lr use 'constant'");
    for (const auto i : c10::irange(m.size())) {
      TORCH_CHECK_VALUE(m[i] >= 1 && (i == 0 || m[i] > m[i - 1]), "LrSchedule: milestones[", i,
                        "]=", m[i], " must be >= 1 and greater than the milestone before it: "
                        "milestones are strictly increasing optimizer steps");
    }
  }
  if (kind == LrScheduleKind::kCosine) {
    TORCH_CHECK_VALUE(o.total_steps() > o.warmup_steps(), "LrSchedule: kind 'cosine' needs "
                      "total_steps (the run's optimizer steps, warmup included) > warmup_steps=",
                      o.warmup_steps(), ", got total_steps=", o.total_steps());
    TORCH_CHECK_VALUE(std::isfinite(o.eta_min()) && o.eta_min() >= 0, "LrSchedule: eta_min=",
                      o.eta_min(), " must be a finite number >= 0");
  }
}

double LrSchedule::lr_at(int64_t step) const {
  TORCH_CHECK_VALUE(step >= 0, "LrSchedule::lr_at: step=", step, " must be >= 0");
  const int64_t warmup = options_.warmup_steps();
  if (step >= warmup) return main_lr(step - warmup);
  // LinearLR(start_factor=1/W, end_factor=1, total_iters=W).
  const double w = static_cast<double>(warmup);
  return options_.base_lr() * (1.0 / w + (1.0 - 1.0 / w) * static_cast<double>(step) / w);
}

double LrSchedule::main_lr(int64_t t) const {
  const LrScheduleOptions& o = options_;
  if (o.kind() == LrScheduleKind::kStep) return o.base_lr() * std::pow(o.gamma(), static_cast<double>(t / o.step_size()));
  if (o.kind() == LrScheduleKind::kMultiStep) {
    const auto passed = std::upper_bound(o.milestones().begin(), o.milestones().end(), t) -
                        o.milestones().begin();
    return o.base_lr() * std::pow(o.gamma(), static_cast<double>(passed));
  }
  if (o.kind() == LrScheduleKind::kCosine) {
    const int64_t period = o.total_steps() - o.warmup_steps();
    if (t >= period) return o.eta_min();
    const double cos = std::cos(M_PI * static_cast<double>(t) / static_cast<double>(period));
    return o.eta_min() + (o.base_lr() - o.eta_min()) * (1.0 + cos) / 2.0;
  }
  return o.base_lr();
}

void LrSchedule::apply(torch::optim::Optimizer& optimizer, int64_t step) const {
  const double lr = lr_at(step);
  for (torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace lockstep::train
