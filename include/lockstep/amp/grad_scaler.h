#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <string>
#include <unordered_map>

#include "lockstep/dist/process_group.h"

namespace lockstep::amp {

// One name for the pointer type, so that TORCH_ARG's `const T&` is a const pointer, not a pointer
// to const.
using ProcessGroupPtr = dist::ProcessGroup*;

struct GradScalerOptions {
  TORCH_ARG(double, init_scale) = 65536.0;  // 2^16
  TORCH_ARG(double, growth_factor) = 2.0;   // > 1
  TORCH_ARG(double, backoff_factor) = 0.5;  // in (0, 1)
  TORCH_ARG(int64_t, growth_interval) = 2000;  // finite steps in a row before the scale grows
  TORCH_ARG(bool, enabled) = true;
  // With a group, whether any gradient was inf/NaN is decided over all ranks, so all skip together
  // (Note [Inf checks across ranks]). Not owned; must outlive the scaler.
  TORCH_ARG(ProcessGroupPtr, group) = nullptr;
};

// str -> number, as torch::pickle_save writes and torch::pickle_load returns dicts (LibTorch has no
// default-constructible Dict<std::string, IValue>).
using StateDict = c10::impl::GenericDict;

// torch.cuda.amp.GradScaler (dynamic loss scaling) for LibTorch optimizers, same defaults, same
// state machine, same update rule (torch._amp_update_scale_):
//   any inf/NaN gradient: the step is skipped, scale *= backoff_factor, tracker = 0
//   otherwise:            tracker += 1; at growth_interval: scale *= growth_factor, tracker = 0
// The scale is an fp32 number like PyTorch's; growth that would overflow it is not applied.
//
//   lockstep::amp::GradScaler scaler;
//   for (...) {
//     optimizer.zero_grad();
//     { lockstep::amp::AutocastGuard autocast; loss = criterion(model->forward(x), y); }
//     scaler.scale(loss).backward();
//     scaler.unscale_(optimizer);           // optional: only to clip or inspect true gradients
//     scaler.step(optimizer);               // skipped when a gradient was inf/NaN
//     scaler.update();
//   }
//
// A disabled scaler is a no-op: scale() returns its input, step() just steps, get_scale() is 1.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  // outputs * scale, computed in fp32 at least (half outputs are promoted, as in Python, so the
  // 65536 default cannot overflow an fp16 loss). The loss keeps its shape.
  torch::Tensor scale(const torch::Tensor& outputs) const;
  // Divides the optimizer's gradients by the scale in place and records whether any was inf/NaN.
  // At most once per optimizer between update()s.
  void unscale_(torch::optim::Optimizer& optimizer);
  // Unscales if unscale_() was not called, then steps unless a gradient was inf/NaN.
  // Returns whether optimizer.step() ran.
  bool step(torch::optim::Optimizer& optimizer);
  // Adjusts the scale from this iteration's inf checks (every optimizer that stepped).
  void update();
  // Sets the scale to `new_scale` instead; the growth tracker is left as it is.
  void update(double new_scale);

  double get_scale() const;
  int64_t get_growth_tracker() const;
  double get_growth_factor() const { return options_.growth_factor(); }
  double get_backoff_factor() const { return options_.backoff_factor(); }
  int64_t get_growth_interval() const { return options_.growth_interval(); }
  bool is_enabled() const { return options_.enabled(); }
  dist::ProcessGroup* group() const { return options_.group(); }

  // PyTorch's keys and value types: scale, growth_factor, backoff_factor (float), growth_interval,
  // _growth_tracker (int). Empty when disabled. Loadable by Python's GradScaler.load_state_dict.
  StateDict state_dict() const;
  // Errors name a missing key or a value of the wrong type or range. Ignored when disabled.
  void load_state_dict(const StateDict& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    bool found_inf = false;
  };

  GradScalerOptions options_;
  float scale_;               // fp32, like PyTorch's _scale tensor
  int64_t growth_tracker_ = 0;
  std::unordered_map<const torch::optim::Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace lockstep::amp
