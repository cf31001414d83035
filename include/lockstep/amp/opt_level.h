#pragma once

#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <string>
#include <vector>

#include "lockstep/amp/autocast.h"
#include "lockstep/amp/grad_scaler.h"

namespace lockstep::amp {

// Apex's optimization levels.
//   O0  fp32 throughout; no loss scaling.
//   O1  fp32 model, forward under autocast (AutocastGuard); dynamic loss scaling.
//   O2  model in the half dtype except BatchNorm (fp32), fp32 master weights that the optimizer
//       updates, inputs cast to half and outputs to fp32; dynamic loss scaling.
//   O3  everything in the half dtype, BatchNorm included, no masters; no loss scaling.
enum class OptLevel { kO0, kO1, kO2, kO3 };

// "O0".."O3", in OptLevel's order (see core/names.h); parse_opt_level rejects anything else,
// listing them.
const std::vector<std::string>& opt_level_names();
OptLevel parse_opt_level(const std::string& text);
std::string to_string(OptLevel level);

// Runs tiny linear, conv2d and batch_norm ops in `dtype` on `device` and throws, naming the op
// and suggesting bf16, if this LibTorch has no kernels for them (CPU builds have no fp16 matmul or
// convolution). `dtype` must be kBFloat16 or kHalf.
void check_precision_supported(torch::Device device, torch::ScalarType dtype);

struct AmpOptions {
  TORCH_ARG(torch::ScalarType, dtype) = torch::kBFloat16;  // the half dtype: kBFloat16 or kHalf
  // Loss scaling; unset: the level's own (dynamic GradScaler defaults at O1/O2, none at O0/O3).
  TORCH_ARG(c10::optional<GradScalerOptions>, loss_scale) = c10::nullopt;
  // Decide inf/NaN skips over all ranks of this group (Note [Inf checks across ranks]).
  TORCH_ARG(ProcessGroupPtr, group) = nullptr;
};

class Amp;
// Prepares `model` and `optimizer` for `level` and returns the per-step object. Call it once, on
// the fp32 model, before DistributedDataParallel wraps the model (its buckets follow the
// parameters' dtypes) and before the first step. At O2 the optimizer must be fresh (no state yet):
// its half parameters are replaced by fp32 masters copied from the fp32 model before conversion.
// Checks the precision first (check_precision_supported) at O1-O3. The group in `options` is the
// loss scaler's (skips decided by all ranks). Every rank must already hold the same weights, so
// O2's masters agree across ranks: load checkpoint weights and call
// parallel::sync_module_states before initialize, not after (Note [O2 master weights]).
Amp initialize(torch::nn::Module& model, torch::optim::Optimizer& optimizer, OptLevel level,
               const AmpOptions& options = {});

// The per-step side of an opt level, returned by initialize(). It holds the optimizer by pointer:
// the optimizer must outlive it.
//
//   lockstep::parallel::sync_module_states(*model, *group);              // rank 0's weights, once
//   auto amp = lockstep::amp::initialize(*model, optimizer, lockstep::amp::OptLevel::kO2,
//                                        lockstep::amp::AmpOptions().group(group.get()));
//   lockstep::parallel::DistributedDataParallel ddp(
//       model, *group, lockstep::parallel::DistributedDataParallelOptions().init_sync(false));
//   for (auto& [x, y] : batches) {
//     amp.zero_grad();
//     torch::Tensor loss;
//     {
//       auto autocast = amp.autocast();                                 // on at O1 only
//       loss = criterion(amp.cast_output(ddp.forward(amp.cast_input(x))), y);
//     }
//     amp.scale_loss(loss).backward();
//     amp.unscale_();                                                   // only to clip master_params() grads
//     bool stepped = amp.step();                                        // false: inf/NaN, step skipped
//     amp.update();
//   }
class Amp {
 public:
  OptLevel level() const { return level_; }
  torch::ScalarType dtype() const { return dtype_; }  // the half dtype (not used at O0)

  // An AutocastGuard that is enabled at O1 and does nothing at other levels; hold it over the
  // forward and the loss (not the backward).
  AutocastGuard autocast() const;
  // O2/O3: floating tensors cast to dtype() / to fp32 (Apex casts model inputs and outputs so).
  // O0/O1: unchanged.
  torch::Tensor cast_input(const torch::Tensor& x) const;
  torch::Tensor cast_output(const torch::Tensor& y) const;

  // Zeroes the optimizer's gradients, and at O2 the model's half ones too (one pass per tensor).
  // set_to_none (Python's optimizer.zero_grad(set_to_none=True)) drops them instead: no pass, and
  // the next backward hands its gradients over instead of adding them to zeros. A parameter that
  // then gets no gradient keeps none, and the optimizer skips it, as in PyTorch.
  void zero_grad(bool set_to_none = false);
  torch::Tensor scale_loss(const torch::Tensor& loss) const { return scaler_.scale(loss); }
  // O2: copies the model's half gradients into the masters' fp32 .grad. Then divides the
  // optimizer's gradients by the loss scale. Optional; step() does it when not done.
  void unscale_();
  // unscale_() if not done; the optimizer steps unless a gradient was inf/NaN on any rank of the
  // scaler's group; O2: masters are copied (rounded) into the half parameters. Returns whether
  // the optimizer stepped.
  bool step();
  // Adjusts the loss scale for the next step.
  void update() { scaler_.update(); }

  // In the model's parameters() order, the tensor holding each one's full-precision value: its
  // fp32 master at O2 where it is half, the parameter itself otherwise. Save these (with the
  // model's names) for an exact O2 checkpoint.
  const std::vector<torch::Tensor>& master_params() const { return masters_; }
  GradScaler& grad_scaler() { return scaler_; }
  const GradScaler& grad_scaler() const { return scaler_; }

 private:
  friend Amp initialize(torch::nn::Module&, torch::optim::Optimizer&, OptLevel, const AmpOptions&);
  Amp(OptLevel level, torch::ScalarType dtype, torch::DeviceType device, torch::optim::Optimizer& optimizer,
      std::vector<std::string> names, std::vector<torch::Tensor> model_params, std::vector<torch::Tensor> masters,
      GradScalerOptions scaler);
  bool half_model() const;  // O2, O3

  OptLevel level_;
  torch::ScalarType dtype_;
  torch::DeviceType device_;
  torch::optim::Optimizer* optimizer_;
  std::vector<std::string> names_;  // the model's parameter names, for errors
  std::vector<torch::Tensor> model_params_;
  std::vector<torch::Tensor> masters_;  // masters_[i] is model_params_[i] unless it has a master
  GradScaler scaler_;
  bool unscaled_ = false;         // unscale_() ran since the last step()
  bool masters_checked_ = false;  // See Note [O2 master weights]
};

}  // namespace lockstep::amp
