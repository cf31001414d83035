#include "lockstep/amp/opt_level.h"

#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/functional/conv.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/modules/batchnorm.h>

#include <string>
#include <unordered_set>

#include "lockstep/core/names.h"

namespace lockstep::amp {
namespace {

bool is_batch_norm(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m) != nullptr;
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string rank_suffix(const dist::ProcessGroup* group) {
  return group == nullptr ? "" : " on rank " + std::to_string(group->rank()) + " of " + std::to_string(group->size());
}

// A named floating-point parameter or buffer that `level` stores in the half dtype.
struct Converted {
  std::string name;
  torch::Tensor tensor;
  bool is_parameter;
};

// Floating parameters and buffers of every module, BatchNorm's skipped at O2 (Apex keeps BN in
// fp32 there: its statistics need the range and precision).
std::vector<Converted> tensors_to_convert(torch::nn::Module& model, OptLevel level) {
  std::vector<Converted> out;
  for (const auto& item : model.named_modules()) {
    if (level == OptLevel::kO2 && is_batch_norm(*item.value())) continue;
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false))
      if (p.value().is_floating_point()) out.push_back({prefix + p.key(), p.value(), true});
    for (const auto& b : item.value()->named_buffers(/*recurse=*/false))
      if (b.value().is_floating_point()) out.push_back({prefix + b.key(), b.value(), false});
  }
  return out;
}

// Note [O2 master weights]: the optimizer's entries for half parameters are replaced, in place
// in its param groups, by fp32 copies taken before the model is converted, so the masters start
// exact. Optimizer state is keyed by parameter identity, hence the optimizer must be fresh. Each
// step copies the half gradients into the masters, steps them, and copies them back rounded.
// Anything that writes the model's weights after initialize (DistributedDataParallel taking rank
// 0's, a checkpoint load) would be undone by the next copy back, silently and differently on each
// rank. So ranks must agree before initialize (parallel::sync_module_states, as DdpStrategy does:
// it checks that the models match before any weight travels, and the weights travel once), and
// the first unscale_ checks that every half parameter still equals its master rounded.
std::vector<torch::Tensor> make_masters(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params,
                                        const std::vector<Converted>& converted) {
  TORCH_CHECK(optimizer.state().empty(), "amp::initialize at O2 needs an optimizer that has not stepped yet, but it ",
              "holds state for ", optimizer.state().size(), " parameters: call initialize before the first step, ",
              "and load a checkpoint's optimizer state after it");
  std::unordered_set<const c10::TensorImpl*> half;
  for (const Converted& c : converted)
    if (c.is_parameter) half.insert(c.tensor.unsafeGetTensorImpl());
  std::unordered_map<const c10::TensorImpl*, torch::Tensor> master_of;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (half.count(p.unsafeGetTensorImpl()) == 0) continue;
      torch::Tensor master = p.detach().clone().requires_grad_(p.requires_grad());
      master_of.emplace(p.unsafeGetTensorImpl(), master);
      p = master;
    }
  }
  std::vector<torch::Tensor> masters;
  for (const auto& p : params) {
    auto it = master_of.find(p.unsafeGetTensorImpl());
    masters.push_back(it == master_of.end() ? p : it->second);
  }
  return masters;
}

}  // namespace

const std::vector<std::string>& opt_level_names() {
  static const std::vector<std::string> names{"O0", "O1", "O2", "O3"};
  return names;
}

OptLevel parse_opt_level(const std::string& text) { return enum_from_name<OptLevel>(opt_level_names(), text, "opt level"); }

std::string to_string(OptLevel level) { return enum_name(opt_level_names(), level); }

void check_precision_supported(torch::Device device, torch::ScalarType dtype) {
  TORCH_CHECK(dtype == torch::kBFloat16 || dtype == torch::kHalf,
              "amp precision must be torch::kBFloat16 or torch::kHalf, got ", dtype);
  namespace F = torch::nn::functional;
  const auto options = torch::TensorOptions().device(device).dtype(dtype);
  const char* op = "linear";
  try {
    F::linear(torch::ones({2, 4}, options), torch::ones({3, 4}, options));
    op = "conv2d";
    const auto images = F::conv2d(torch::ones({2, 1, 4, 4}, options), torch::ones({2, 1, 3, 3}, options));
    op = "batch_norm";
    F::batch_norm(images, torch::zeros({2}, options), torch::ones({2}, options),
                  F::BatchNormFuncOptions().weight(torch::ones({2}, options)).bias(torch::zeros({2}, options)).training(true));
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "this LibTorch cannot train in ", dtype, " on ", device, ": ", op, " failed with '",
                first_line(e.what_without_backtrace()), "'. ",
                dtype == torch::kHalf ? "Use bf16 (torch::kBFloat16) instead: same 16-bit storage, fp32's range."
                                      : "Train in fp32 (O0) instead.");
  }
}

Amp::Amp(OptLevel level, torch::ScalarType dtype, torch::DeviceType device, torch::optim::Optimizer& optimizer,
         std::vector<std::string> names, std::vector<torch::Tensor> model_params, std::vector<torch::Tensor> masters,
         GradScalerOptions scaler)
    : level_(level), dtype_(dtype), device_(device), optimizer_(&optimizer), names_(std::move(names)),
      model_params_(std::move(model_params)), masters_(std::move(masters)), scaler_(scaler) {}

AutocastGuard Amp::autocast() const { return AutocastGuard(device_, dtype_, level_ == OptLevel::kO1); }

bool Amp::half_model() const { return level_ == OptLevel::kO2 || level_ == OptLevel::kO3; }

torch::Tensor Amp::cast_input(const torch::Tensor& x) const {
  return half_model() && x.is_floating_point() ? x.to(dtype_) : x;
}

torch::Tensor Amp::cast_output(const torch::Tensor& y) const {
  return half_model() && y.is_floating_point() ? y.to(torch::kFloat) : y;
}

void Amp::zero_grad(bool set_to_none) {
  // The optimizer's parameters: the masters at O2, the model's own parameters at other levels.
  if (set_to_none) {
    for (auto& group : optimizer_->param_groups())
      for (auto& p : group.params()) p.mutable_grad() = torch::Tensor();
  } else {
    optimizer_->zero_grad(/*set_to_none=*/false);  // LibTorch 2.x defaults to true
  }
  if (level_ != OptLevel::kO2) return;
  for (auto& p : model_params_) {
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.mutable_grad() = torch::Tensor();
    } else {
      p.mutable_grad().zero_();
    }
  }
}

void Amp::unscale_() {
  // See Note [O2 master weights].
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < model_params_.size(); ++i) {
    const torch::Tensor& grad = model_params_[i].grad();
    torch::Tensor& master = masters_[i];
    if (master.is_same(model_params_[i])) continue;
    TORCH_CHECK(masters_checked_ || torch::equal(model_params_[i], master.to(dtype_)), "amp ",
                to_string(level_), ": parameter '", names_[i], "' was changed after amp::initialize",
                rank_suffix(scaler_.group()), ", so its fp32 master no longer matches it. Load weights before "
                "initialize, and with DistributedDataParallel call parallel::sync_module_states(model, group) before "
                "initialize (or train through parallel::DdpStrategy)");
    if (!grad.defined()) {
      master.mutable_grad() = torch::Tensor();
    } else if (master.grad().defined()) {
      master.mutable_grad().copy_(grad);
    } else {
      master.mutable_grad() = grad.to(master.scalar_type());
    }
  }
  masters_checked_ = true;
  scaler_.unscale_(*optimizer_);
  unscaled_ = true;
}

bool Amp::step() {
  if (!unscaled_) unscale_();
  unscaled_ = false;
  const bool stepped = scaler_.step(*optimizer_);
  if (stepped) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < model_params_.size(); ++i)
      if (!masters_[i].is_same(model_params_[i])) model_params_[i].copy_(masters_[i]);
  }
  return stepped;
}

Amp initialize(torch::nn::Module& model, torch::optim::Optimizer& optimizer, OptLevel level,
               const AmpOptions& options) {
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  for (const auto& p : model.named_parameters()) {
    names.push_back(p.key());
    params.push_back(p.value());
  }
  TORCH_CHECK(!params.empty(), "amp::initialize: the model has no parameters");
  const torch::Device device = params.front().device();
  if (level != OptLevel::kO0) check_precision_supported(device, options.dtype());

  GradScalerOptions scaling = options.loss_scale().value_or(
      GradScalerOptions().enabled(level == OptLevel::kO1 || level == OptLevel::kO2));
  if (options.group() != nullptr) scaling.group(options.group());
  std::vector<torch::Tensor> masters = params;
  if (level == OptLevel::kO2 || level == OptLevel::kO3) {
    const std::vector<Converted> converted = tensors_to_convert(model, level);
    for (const Converted& c : converted)
      TORCH_CHECK(c.tensor.scalar_type() == torch::kFloat, "amp::initialize at ", to_string(level), " expects an fp32 ",
                  "model, but '", c.name, "' is ", c.tensor.scalar_type(),
                  ": build the model in fp32 and call initialize once; it converts the model itself");
    if (level == OptLevel::kO2) masters = make_masters(optimizer, params, converted);
    torch::NoGradGuard no_grad;
    for (const Converted& c : converted) c.tensor.set_data(c.tensor.to(options.dtype()));
  }
  return Amp(level, options.dtype(), device.type(), optimizer, std::move(names), params, std::move(masters), scaling);
}

}  // namespace lockstep::amp
