#include "lockstep/models/torchscript_module.h"

#include <c10/util/Exception.h>

#include <memory>

namespace lockstep::models {
namespace {

// Registers `from`'s own parameters and buffers in `into`, and a mirror of each child.
void mirror(torch::nn::Module& into, const torch::jit::Module& from) {
  for (const auto& p : from.named_parameters(/*recurse=*/false))
    into.register_parameter(p.name, p.value, p.value.requires_grad());
  for (const auto& b : from.named_buffers(/*recurse=*/false)) into.register_buffer(b.name, b.value);
  for (const auto& child : from.named_children()) {
    auto sub = std::make_shared<torch::nn::Module>(child.name);
    mirror(*sub, child.value);
    into.register_module(child.name, sub);
  }
}

}  // namespace

torch::jit::Module load_torchscript(const std::string& file) {
  torch::jit::Module module;
  try {
    module = torch::jit::load(file);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "'", file, "' is not a TorchScript module (torch.jit.save of a scripted or traced module): ",
                e.what_without_backtrace());
  }
  TORCH_CHECK(module.find_method("forward").has_value(), "'", file, "' holds TorchScript without a forward method ",
              "(torch.save of tensors?); save the module itself with torch.jit.save(torch.jit.script(model), ...)");
  return module;
}

TorchScriptModuleImpl::TorchScriptModuleImpl(const std::string& file)
    : torch::nn::Module("TorchScriptModule"), script_(load_torchscript(file)), file_(file) {
  mirror(*this, script_);
  script_.train(is_training());
}

torch::Tensor TorchScriptModuleImpl::forward(const torch::Tensor& input) {
  const c10::IValue out = script_.forward({input});
  TORCH_CHECK(out.isTensor(), "'", file_, "' returns a ", out.tagKind(), " from forward; a model returns one tensor");
  return out.toTensor();
}

void TorchScriptModuleImpl::train(bool on) {
  torch::nn::Module::train(on);
  script_.train(on);
}

}  // namespace lockstep::models
