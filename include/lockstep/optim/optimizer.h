#pragma once

#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lockstep::optim {

// The optimizers lockstep builds and whose state it saves: LibTorch's torch::optim::SGD, Adam and
// AdamW, which update parameters as Python's torch.optim classes of the same names do.
enum class OptimizerKind { kSGD, kAdam, kAdamW };

// {"sgd", "adam", "adamw"}, in OptimizerKind's order: the one list of allowed names (flags, help
// text and errors all read it).
const std::vector<std::string>& optimizer_names();
// One of optimizer_names(); anything else is an error listing them.
OptimizerKind parse_optimizer(const std::string& name);
std::string to_string(OptimizerKind kind);

// What make_optimizer builds. Defaults are PyTorch's for the kind. Options that belong to one kind
// only are refused by validate() when set away from their default for another kind (momentum=0.9
// for adam is a mistake, not a request).
struct OptimizerOptions {
  explicit OptimizerOptions(OptimizerKind kind, double lr);

  TORCH_ARG(OptimizerKind, kind);
  TORCH_ARG(double, lr);  // >= 0
  // sgd only. Dampening is always 0 (PyTorch's default); nesterov needs momentum > 0.
  TORCH_ARG(double, momentum) = 0.0;
  TORCH_ARG(bool, nesterov) = false;
  // adam and adamw only: Python's betas = (beta1, beta2), each in [0, 1); eps > 0.
  TORCH_ARG(double, beta1) = 0.9;
  TORCH_ARG(double, beta2) = 0.999;
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(bool, amsgrad) = false;
  // >= 0. Unset: PyTorch's default for the kind, see weight_decay_or_default(). For sgd and adam it
  // is added to the gradient (L2); for adamw it is decoupled (p *= 1 - lr * weight_decay).
  TORCH_ARG(c10::optional<double>, weight_decay) = c10::nullopt;

 public:
  // weight_decay() if set, else 0 for sgd and adam, 0.01 for adamw.
  double weight_decay_or_default() const;
  // Throws c10::ValueError naming the optimizer, the option and its value: non-finite numbers,
  // lr < 0, momentum < 0, nesterov without momentum, betas outside [0, 1), eps <= 0,
  // weight_decay < 0, and options of another kind set away from their defaults.
  void validate() const;
};

// The LibTorch options of `options`' kind (torch::optim::SGDOptions, AdamOptions or AdamWOptions),
// validated first: what make_optimizer gives its group, and what a loaded state's groups become.
std::unique_ptr<torch::optim::OptimizerOptions> make_torch_options(const OptimizerOptions& options);

// A LibTorch optimizer over `params` (one parameter group) with `options`, validated first. SGD is
// a torch::optim::SGD whose step() updates each fp32 parameter in one pass (Note [SGD in one pass],
// src/optim/fused_sgd.h): LibTorch's values, options, state and serialisation.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(std::vector<torch::Tensor> params,
                                                        const OptimizerOptions& options);

}  // namespace lockstep::optim
