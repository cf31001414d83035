#include "lockstep/optim/optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <tuple>

#include "fused_sgd.h"
#include "lockstep/core/names.h"

namespace lockstep::optim {
namespace {

torch::optim::SGDOptions sgd_options(const OptimizerOptions& o) {
  return torch::optim::SGDOptions(o.lr())
      .momentum(o.momentum())
      .nesterov(o.nesterov())
      .weight_decay(o.weight_decay_or_default());
}

template <typename Options>  // AdamOptions or AdamWOptions
Options adam_options(const OptimizerOptions& o) {
  return Options(o.lr())
      .betas(std::make_tuple(o.beta1(), o.beta2()))
      .eps(o.eps())
      .weight_decay(o.weight_decay_or_default())
      .amsgrad(o.amsgrad());
}

}  // namespace

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = {"sgd", "adam", "adamw"};
  return names;
}

OptimizerKind parse_optimizer(const std::string& name) {
  return enum_from_name<OptimizerKind>(optimizer_names(), name, "optimizer");
}

std::string to_string(OptimizerKind kind) { return enum_name(optimizer_names(), kind); }

OptimizerOptions::OptimizerOptions(OptimizerKind kind, double lr) : kind_(kind), lr_(lr) {}

double OptimizerOptions::weight_decay_or_default() const {
  if (weight_decay_) return *weight_decay_;
  return kind_ == OptimizerKind::kAdamW ? 0.01 : 0.0;
}

void OptimizerOptions::validate() const {
  const std::string name = "optimizer " + to_string(kind_);
  auto require = [&name](const char* option, double value, bool ok, const char* requirement) {
    TORCH_CHECK_VALUE(std::isfinite(value) && ok, name, ": ", option, " must be ", requirement, ", got ", value);
  };
  // Options of the other kinds must keep these values.
  const OptimizerOptions defaults(kind_, lr_);
  auto unused = [&name](const char* option, double value, double default_value, const char* owners) {
    TORCH_CHECK_VALUE(value == default_value, name, ": ", option, "=", value, " applies only to ", owners);
  };
  require("lr", lr_, lr_ >= 0, "a finite number >= 0");
  const double decay = weight_decay_or_default();
  require("weight_decay", decay, decay >= 0, "a finite number >= 0");
  if (kind_ == OptimizerKind::kSGD) {
    require("momentum", momentum_, momentum_ >= 0, "a finite number >= 0");
    TORCH_CHECK_VALUE(!nesterov_ || momentum_ > 0, name, ": nesterov needs momentum > 0, got momentum=", momentum_);
    unused("beta1", beta1_, defaults.beta1(), "adam and adamw");
    unused("beta2", beta2_, defaults.beta2(), "adam and adamw");
    unused("eps", eps_, defaults.eps(), "adam and adamw");
    TORCH_CHECK_VALUE(!amsgrad_, name, ": amsgrad applies only to adam and adamw");
  } else {
    require("beta1", beta1_, beta1_ >= 0 && beta1_ < 1, "in [0, 1)");
    require("beta2", beta2_, beta2_ >= 0 && beta2_ < 1, "in [0, 1)");
    require("eps", eps_, eps_ > 0, "a finite number > 0");
    unused("momentum", momentum_, defaults.momentum(), "sgd (adam's momentum is beta1)");
    TORCH_CHECK_VALUE(!nesterov_, name, ": nesterov applies only to sgd");
  }
}


std::unique_ptr<torch::optim::OptimizerOptions> make_torch_options(const OptimizerOptions& options) {
  options.validate();
  switch (options.kind()) {
    case OptimizerKind::kSGD:
      return std::make_unique<torch::optim::SGDOptions>(sgd_options(options));
    case OptimizerKind::kAdam:
      return std::make_unique<torch::optim::AdamOptions>(adam_options<torch::optim::AdamOptions>(options));
    case OptimizerKind::kAdamW:
      return std::make_unique<torch::optim::AdamWOptions>(adam_options<torch::optim::AdamWOptions>(options));
  }
  TORCH_CHECK(false, "unknown OptimizerKind ", static_cast<int>(options.kind()));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(std::vector<torch::Tensor> params,
                                                        const OptimizerOptions& options) {
  const std::unique_ptr<torch::optim::OptimizerOptions> o = make_torch_options(options);
  switch (options.kind()) {
    case OptimizerKind::kSGD:
      return std::make_unique<FusedSGD>(std::move(params), static_cast<const torch::optim::SGDOptions&>(*o));
    case OptimizerKind::kAdam:
      return std::make_unique<torch::optim::Adam>(std::move(params), static_cast<const torch::optim::AdamOptions&>(*o));
    case OptimizerKind::kAdamW:
      return std::make_unique<torch::optim::AdamW>(std::move(params),
                                                   static_cast<const torch::optim::AdamWOptions&>(*o));
  }
  TORCH_CHECK(false, "unknown OptimizerKind ", static_cast<int>(options.kind()));
}

}  // namespace lockstep::optim
