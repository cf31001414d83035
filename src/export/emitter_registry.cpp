#include "lockstep/export/emitter_registry.h"

#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <cstring>
#include <sstream>

namespace lockstep::exporting {
namespace {

std::string join_path(const std::string& parent, const std::string& name) {
  return parent.empty() ? name : parent + "." + name;
}

// The module's one-line description (torch::nn::Conv2d(1, 16, kernel_size=[5, 5], ...)).
std::string describe(const torch::nn::Module& module) {
  std::ostringstream s;
  module.pretty_print(s);
  return s.str();
}

}  // namespace

Scope::Scope(const torch::nn::Module& module, std::string path, GraphBuilder& graph)
    : module_(module), path_(std::move(path)), graph_(graph) {}

onnx::NodeProto& Scope::node(const std::string& op_type, const std::vector<std::string>& inputs) {
  return graph_.add_node(op_type, inputs, path_, describe(module_));
}

std::string Scope::op(const std::string& op_type, const std::vector<std::string>& inputs) {
  return node(op_type, inputs).output(0);
}

std::string Scope::initializer(const std::string& key, const torch::Tensor& value) {
  return graph_.add_initializer(join_path(path_, key), value);
}

std::string Scope::child(const std::string& name, const std::string& input) {
  std::shared_ptr<torch::nn::Module> found;
  for (const auto& item : module_.named_children())
    if (item.key() == name) found = item.value();
  TORCH_CHECK(found != nullptr, "cannot export '", path_.empty() ? "the model" : path_, "' (", module_.name(),
              "): its emitter expects a child module '", name, "' but it has [", c10::Join(", ", child_names()),
              "]; register an emitter for this module type that matches its forward()");
  return graph_.emit(*found, join_path(path_, name), input);
}

std::vector<std::string> Scope::child_names() const {
  std::vector<std::string> names;
  for (const auto& item : module_.named_children()) names.push_back(item.key());
  return names;
}

EmitterRegistry EmitterRegistry::with_builtins() {
  EmitterRegistry registry;
  add_layer_emitters(registry);
  add_reference_model_emitters(registry);
  return registry;
}

void EmitterRegistry::add(const std::string& type_name, Emitter emit) { by_name_[type_name] = std::move(emit); }

const Emitter* EmitterRegistry::find(const torch::nn::Module& module) const {
  const auto exact = by_name_.find(module.name());
  if (exact != by_name_.end()) return &exact->second;
  for (auto it = typed_.rbegin(); it != typed_.rend(); ++it)
    if (it->matches(module)) return &it->emit;
  return nullptr;
}

GraphBuilder::GraphBuilder(onnx::GraphProto& graph, const EmitterRegistry& registry)
    : graph_(graph), registry_(registry) {}

std::string GraphBuilder::emit(const torch::nn::Module& module, const std::string& path, const std::string& input) {
  const Emitter* emitter = registry_.find(module);
  TORCH_CHECK(emitter != nullptr, "cannot export '", path.empty() ? "the model" : path, "': no ONNX emitter for layer type '",
              module.name(), "' (", describe(module),
              "); register one with lockstep::exporting::EmitterRegistry::add (see docs/inference.md)");
  Scope scope(module, path, *this);
  return (*emitter)(scope, input);
}

onnx::NodeProto& GraphBuilder::add_node(const std::string& op_type, const std::vector<std::string>& inputs,
                                        const std::string& scope_path, const std::string& doc) {
  // Node "layer1.0/Conv", output "layer1.0/Conv_output"; a second Relu in one scope is "Relu_1".
  std::string name = (scope_path.empty() ? "" : scope_path + "/") + op_type;
  const int64_t used = node_names_[name]++;
  if (used > 0) name += "_" + std::to_string(used);
  onnx::NodeProto* node = graph_.add_node();
  node->set_op_type(op_type);
  node->set_name(name);
  node->set_doc_string(doc);
  for (const auto& in : inputs) node->add_input(in);
  node->add_output(name + "_output");
  return *node;
}

std::string GraphBuilder::add_initializer(const std::string& name, const torch::Tensor& value) {
  TORCH_CHECK(!initializer_names_[name], "cannot export: two initializers named '", name,
              "' (an emitter added the same weight twice)");
  initializer_names_[name] = true;
  *graph_.add_initializer() = to_tensor_proto(name, value);
  return name;
}

void set_attribute(onnx::NodeProto& node, const std::string& name, int64_t value) {
  auto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

void set_attribute(onnx::NodeProto& node, const std::string& name, float value) {
  auto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(value);
}

void set_attribute(onnx::NodeProto& node, const std::string& name, const std::vector<int64_t>& values) {
  auto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

onnx::TensorProto to_tensor_proto(const std::string& name, const torch::Tensor& value) {
  // Integer tensors keep int64 (shapes, indices); everything else becomes fp32.
  const bool integral = !c10::isFloatingType(value.scalar_type()) && !c10::isComplexType(value.scalar_type());
  const torch::Tensor t = value.detach().to(torch::kCPU, integral ? torch::kLong : torch::kFloat).contiguous();
  onnx::TensorProto proto;
  proto.set_name(name);
  proto.set_data_type(integral ? onnx::TensorProto::INT64 : onnx::TensorProto::FLOAT);
  for (int64_t d : t.sizes()) proto.add_dims(d);
  // x86-64 is little-endian, as ONNX's raw_data is.
  proto.set_raw_data(std::string(static_cast<const char*>(t.data_ptr()), t.nbytes()));
  return proto;
}

torch::Tensor from_tensor_proto(const onnx::TensorProto& proto) {
  TORCH_CHECK(proto.data_type() == onnx::TensorProto::FLOAT || proto.data_type() == onnx::TensorProto::INT64,
              "initializer '", proto.name(), "' has ONNX data type ", proto.data_type(), "; only FLOAT and INT64 are read");
  const auto dtype = proto.data_type() == onnx::TensorProto::FLOAT ? torch::kFloat : torch::kLong;
  std::vector<int64_t> dims(proto.dims().begin(), proto.dims().end());
  torch::Tensor t = torch::empty(dims, dtype);
  if (proto.has_raw_data()) {
    TORCH_CHECK(proto.raw_data().size() == t.nbytes(), "initializer '", proto.name(), "' holds ",
                proto.raw_data().size(), " bytes for ", t.nbytes());
    std::memcpy(t.data_ptr(), proto.raw_data().data(), t.nbytes());
  } else if (dtype == torch::kFloat) {
    TORCH_CHECK(proto.float_data_size() == t.numel(), "initializer '", proto.name(), "' size mismatch");
    std::copy(proto.float_data().begin(), proto.float_data().end(), t.data_ptr<float>());
  } else {
    TORCH_CHECK(proto.int64_data_size() == t.numel(), "initializer '", proto.name(), "' size mismatch");
    std::copy(proto.int64_data().begin(), proto.int64_data().end(), t.data_ptr<int64_t>());
  }
  return t;
}

}  // namespace lockstep::exporting
