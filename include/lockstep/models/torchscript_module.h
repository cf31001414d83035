#pragma once
// A model defined in Python and saved as TorchScript (torch.jit.save), trained in C++.

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/script.h>

#include <string>

namespace lockstep::models {

// Note [TorchScript modules as nn::Modules]
// Strategies, optimizers, checkpoints and state dicts work on torch::nn::Module. This wraps a
// torch::jit::Module as one: every parameter and buffer of the script is registered here under its
// Python name (child modules mirrored, so the state dict reads "blocks.0.fc1.weight" as Python's
// does), and they are the same tensors, so an optimizer step or a broadcast through parameters()
// is the script's. A parameter frozen in Python (requires_grad=False) stays frozen. forward() runs
// the script's forward on one tensor, and train()/eval() switch the script's mode too (dropout,
// BatchNorm).
class TorchScriptModuleImpl : public torch::nn::Module {
 public:
  // Loads `file`; throws c10::Error naming it when it is not a TorchScript module with a forward.
  explicit TorchScriptModuleImpl(const std::string& file);

  torch::Tensor forward(const torch::Tensor& input);
  void train(bool on = true) override;

  torch::jit::Module& script() { return script_; }

 private:
  torch::jit::Module script_;
  std::string file_;
};
TORCH_MODULE(TorchScriptModule);

// torch::jit::load(file) with a forward method, or a c10::Error naming the file and the fix.
torch::jit::Module load_torchscript(const std::string& file);

}  // namespace lockstep::models
