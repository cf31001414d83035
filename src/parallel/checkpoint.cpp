#include "lockstep/parallel/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <mutex>

#include "lockstep/amp/autocast.h"

namespace lockstep::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs besides the saved inputs. See Note [Activation checkpointing].
struct Segment : torch::CustomClassHolder {
  SegmentFunction function;
  std::vector<torch::Tensor> parameters;
  std::vector<torch::Tensor> buffers;
  CheckpointOptions options;
  torch::Tensor rng_state;  // (5056) uint8: the CPU generator at the segment's start
  bool autocast = false;
  torch::ScalarType autocast_dtype = torch::kBFloat16;
};

torch::Tensor generator_state() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(const torch::Tensor& state) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

// The segment's outputs with grad on, as in the forward: same generator state and autocast state;
// the generator as it was before the recompute afterwards. Buffers are the caller's to restore,
// after back-propagating: BatchNorm's backward saves the running statistics it was given, and
// autograd refuses them once changed.
variable_list recompute(const Segment& s, const variable_list& inputs) {
  torch::Tensor outside_state;
  if (s.options.preserve_rng_state()) {
    outside_state = generator_state();
    set_generator_state(s.rng_state);
  }
  variable_list outputs;
  {
    torch::AutoGradMode grad_on(true);
    amp::AutocastGuard autocast(torch::kCPU, s.autocast_dtype, s.autocast);
    outputs = s.function(inputs);
  }
  if (s.options.preserve_rng_state()) set_generator_state(outside_state);
  return outputs;
}

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.clone());
  return out;
}

void restore(const std::vector<torch::Tensor>& tensors, const std::vector<torch::Tensor>& saved) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(saved[i]);
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // inputs and parameters as TensorLists: the Function's differentiable inputs.
  static variable_list forward(AutogradContext* ctx, const c10::intrusive_ptr<Segment>& segment,
                               at::TensorList inputs, at::TensorList parameters) {
    ctx->saved_data["segment"] = c10::IValue::make_capsule(segment);
    ctx->save_for_backward(inputs.vec());
    variable_list outputs = segment->function(inputs.vec());  // grad mode is off here
    for (const auto& out : outputs)
      TORCH_CHECK_VALUE(out.defined() && out.is_floating_point(), "checkpoint: a segment's outputs must be defined "
                        "floating-point tensors (they carry gradients), got ",
                        out.defined() ? std::string(c10::toString(out.scalar_type())) : std::string("none"),
                        "; return integer results from outside the checkpointed segment");
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto segment = c10::static_intrusive_pointer_cast<Segment>(ctx->saved_data["segment"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    variable_list inputs;  // detached copies, so the recompute's graph ends at them
    for (const auto& t : saved) inputs.push_back(t.detach().requires_grad_(t.requires_grad()));
    const std::vector<torch::Tensor> buffers = copies(segment->buffers);  // as the forward left them
    const variable_list outputs = recompute(*segment, inputs);
    TORCH_CHECK(outputs.size() == grad_outputs.size(), "checkpoint: the recompute returned ", outputs.size(),
                " outputs but the forward returned ", grad_outputs.size(), ": the segment must be deterministic "
                "in its structure");
    variable_list roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!outputs[i].requires_grad() || !grad_outputs[i].defined()) continue;
      roots.push_back(outputs[i]);
      root_grads.push_back(grad_outputs[i]);
    }
    // One gradient per argument of forward(): none for the segment, then inputs, then parameters.
    variable_list wrt;
    std::vector<size_t> slot;  // position of each of `wrt` in forward()'s arguments
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].requires_grad()) wrt.push_back(inputs[i]), slot.push_back(1 + i);
    for (size_t i = 0; i < segment->parameters.size(); ++i)
      if (segment->parameters[i].requires_grad()) wrt.push_back(segment->parameters[i]), slot.push_back(1 + inputs.size() + i);
    variable_list grads(1 + inputs.size() + segment->parameters.size());
    if (!roots.empty() && !wrt.empty()) {
      const variable_list found = torch::autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false,
                                                        /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t k = 0; k < found.size(); ++k) grads[slot[k]] = found[k];
    }
    restore(segment->buffers, buffers);
    return grads;
  }
};

bool any_requires_grad(const std::vector<torch::Tensor>& tensors) {
  for (const auto& t : tensors)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

}  // namespace

std::vector<torch::Tensor> checkpoint(const SegmentFunction& function, const std::vector<torch::Tensor>& inputs,
                                      const std::vector<torch::Tensor>& parameters,
                                      const std::vector<torch::Tensor>& buffers, const CheckpointOptions& options) {
  TORCH_CHECK_VALUE(static_cast<bool>(function), "checkpoint: the segment function is empty");
  // Nothing would be recorded for backward: run the segment as it is (evaluation, frozen weights).
  if (!torch::GradMode::is_enabled() || !(any_requires_grad(inputs) || any_requires_grad(parameters)))
    return function(inputs);
  for (size_t i = 0; i < inputs.size(); ++i)
    TORCH_CHECK_VALUE(inputs[i].defined(), "checkpoint: input ", i, " is undefined");
  auto segment = c10::make_intrusive<Segment>();
  segment->function = function;
  segment->parameters = parameters;
  segment->buffers = buffers;
  segment->options = options;
  if (options.preserve_rng_state()) segment->rng_state = generator_state();
  segment->autocast = amp::autocast_enabled(torch::kCPU);
  segment->autocast_dtype = amp::autocast_dtype(torch::kCPU);
  return CheckpointFunction::apply(segment, at::TensorList(inputs), at::TensorList(parameters));
}

torch::Tensor checkpoint(torch::nn::Module& module, const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                         const torch::Tensor& input, const CheckpointOptions& options) {
  auto segment = [forward](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{forward(in[0])}; };
  return checkpoint(segment, {input}, module.parameters(), module.buffers(), options)[0];
}

torch::Tensor checkpoint_block(const models::Block& block, const torch::Tensor& input) {
  auto segment = [forward = block.forward](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{forward(in[0])};
  };
  return checkpoint(segment, {input}, models::block_parameters(block), models::block_buffers(block))[0];
}

}  // namespace lockstep::parallel
