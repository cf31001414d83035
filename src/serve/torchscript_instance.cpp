#include "torchscript_instance.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/script.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "lockstep/models/torchscript_module.h"

namespace lockstep::serve {
namespace {

// k of a name ending in "__<k>" (INPUT__0, OUTPUT__12), Triton's naming convention.
std::optional<size_t> named_index(const std::string& name) {
  const size_t at = name.rfind("__");
  if (at == std::string::npos || at + 2 == name.size() || name.size() - at > 8) return std::nullopt;
  const std::string digits = name.substr(at + 2);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return static_cast<size_t>(std::stoul(digits));
}

// "INPUT__0 (TYPE_FP32, dims [16])" for each of `specs`.
std::string declared(const std::vector<TensorSpec>& specs) {
  std::vector<std::string> items;
  for (const TensorSpec& t : specs)
    items.push_back(t.name + " (TYPE_" + t.datatype + ", dims [" + c10::Join(", ", t.dims) + "])");
  return c10::Join(", ", items);
}

// Where each of `specs` goes among `count` places: by `names` (forward's argument names; empty for
// outputs), by "__<k>", or in order. See Note [TorchScript inputs and outputs].
std::vector<size_t> positions(const std::vector<TensorSpec>& specs, const std::vector<std::string>& names) {
  std::vector<size_t> by_name, by_index, in_order;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto argument = std::find(names.begin(), names.end(), specs[i].name);
    if (argument != names.end()) by_name.push_back(static_cast<size_t>(argument - names.begin()));
    if (const auto k = named_index(specs[i].name)) by_index.push_back(*k);
    in_order.push_back(i);
  }
  auto distinct = [](std::vector<size_t> v) {
    std::sort(v.begin(), v.end());
    return std::adjacent_find(v.begin(), v.end()) == v.end();
  };
  if (by_name.size() == specs.size() && distinct(by_name)) return by_name;
  if (by_index.size() == specs.size() && distinct(by_index)) return by_index;
  return in_order;
}

// forward's return value as its tensors, in order.
Tensors returned_tensors(const c10::IValue& out, const std::string& file) {
  if (out.isTensor()) return {out.toTensor()};
  TORCH_CHECK(out.isTuple() || out.isList(), "'", file, "' returns a ", out.tagKind(),
              " from forward; a served module returns a tensor, or a tuple or list of tensors");
  Tensors tensors;
  const auto take = [&](const c10::IValue& item) {
    TORCH_CHECK(item.isTensor(), "'", file, "' returns a ", out.tagKind(), " holding a ", item.tagKind(),
                "; a served module returns a tensor, or a tuple or list of tensors");
    tensors.push_back(item.toTensor());
  };
  if (out.isTuple()) {
    for (const c10::IValue& item : out.toTupleRef().elements()) take(item);
  } else {
    for (const c10::IValue& item : out.toListRef()) take(item);
  }
  return tensors;
}

// Checks forward's arguments against the config's inputs; returns the argument each input is.
std::vector<size_t> argument_positions(const torch::jit::Module& module, const ModelConfig& config,
                                       const std::string& file) {
  const c10::FunctionSchema& schema = module.get_method("forward").function().getSchema();
  std::vector<std::string> names;  // forward's arguments after self
  size_t required = 0;
  for (size_t i = 1; i < schema.arguments().size(); ++i) {
    names.push_back(schema.arguments()[i].name());
    if (!schema.arguments()[i].default_value()) required = names.size();
  }
  const size_t n = config.inputs.size();
  TORCH_CHECK(n >= required && n <= names.size(), "'", file, "' has ", schema, ", which takes ", required,
              required == names.size() ? "" : " to " + std::to_string(names.size()), " argument(s), but config.pbtxt declares ",
              n, " input(s): ", declared(config.inputs), "; declare one input per argument of forward");
  const std::vector<size_t> at = positions(config.inputs, names);
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(at[i] < n, "'", file, "': input '", config.inputs[i].name, "' names argument ", at[i], " of ", schema,
                ", but the config declares ", n, " input(s); number them INPUT__0 to INPUT__", n - 1);
    const c10::Argument& argument = schema.arguments()[at[i] + 1];
    TORCH_CHECK(c10::TensorType::get()->isSubtypeOf(*argument.type()), "'", file, "' has ", schema, ": its argument '",
                argument.name(), "' is ", argument.type()->repr_str(), ", but config.pbtxt declares it input '",
                config.inputs[i].name, "', a tensor of TYPE_", config.inputs[i].datatype,
                "; a served module's forward takes tensors (annotate the argument as torch.Tensor)");
  }
  return at;
}

}  // namespace

Batcher::Instance torchscript_instance(const ModelConfig& config, const std::string& file) {
  auto module = std::make_shared<torch::jit::Module>(models::load_torchscript(file));
  module->eval();
  const std::vector<size_t> arguments = argument_positions(*module, config, file);
  const std::vector<size_t> outputs = positions(config.outputs, {});
  return [module, arguments, outputs, specs = config.outputs, file](const Tensors& inputs) {
    torch::InferenceMode guard;
    std::vector<c10::IValue> stack(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) stack[arguments[i]] = inputs[i];
    const Tensors returned = returned_tensors(module->forward(std::move(stack)), file);
    Tensors out;
    for (size_t i = 0; i < outputs.size(); ++i) {
      const TensorSpec& spec = specs[i];
      TORCH_CHECK(outputs[i] < returned.size(), "'", file, "' returns ", returned.size(), " tensor(s), but output '",
                  spec.name, "' is tensor ", outputs[i], " of them (config.pbtxt declares ", declared(specs), ")");
      const torch::Tensor& t = returned[outputs[i]];
      TORCH_CHECK(t.scalar_type() == scalar_type(spec.datatype), "'", file, "' returns ", t.scalar_type(),
                  " as output '", spec.name, "', which config.pbtxt declares TYPE_", spec.datatype);
      out.push_back(t);
    }
    return out;
  };
}

}  // namespace lockstep::serve
