#pragma once

#include <onnx/onnx_pb.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::exporting {

class EmitterRegistry;
class GraphBuilder;

// Note [Export by module type]
// A LibTorch model is C++ code, not a graph: there is nothing to trace without Python. The exporter
// therefore walks the module tree and asks a registry, by each module's runtime type, for a small
// emitter that appends that module's ONNX nodes. Leaf layers (Linear, Conv2d, BatchNorm2d, ...)
// map one to one onto ONNX operators; a module whose forward() composes its children (a residual
// block, a reference model) has an emitter that reaches its children by their registered names,
// which are the state-dict keys and stay fixed (Python reads the same keys), whatever C++ type a
// child has: each child is again dispatched by its type. A type without an emitter is an error
// naming the type and where it sits in the model; EmitterRegistry::add teaches the exporter a
// user's own module types.

// One module being emitted: what an emitter sees, and how it adds to the graph.
class Scope {
 public:
  Scope(const torch::nn::Module& module, std::string path, GraphBuilder& graph);

  const torch::nn::Module& module() const { return module_; }
  // The module's state-dict prefix ("layer1.0"; "" for the model itself).
  const std::string& path() const { return path_; }

  // Appends a node named after this module (its doc string is the module's description) and
  // returns it, for attributes; its single output is node.output(0).
  onnx::NodeProto& node(const std::string& op_type, const std::vector<std::string>& inputs);
  // node(...) for operators without attributes; returns the output's name.
  std::string op(const std::string& op_type, const std::vector<std::string>& inputs);
  // Adds `value` (copied as contiguous fp32: bf16-trained weights export in fp32) as the
  // initializer "<path>.<key>", the state-dict key when `key` is a parameter's or buffer's name.
  std::string initializer(const std::string& key, const torch::Tensor& value);
  // Emits the child module registered under `name` on `input`, through the registry; returns its
  // output. Throws naming this module's path and its children when there is no such child.
  std::string child(const std::string& name, const std::string& input);
  // The child's names in registration order (for containers such as Sequential).
  std::vector<std::string> child_names() const;

 private:
  const torch::nn::Module& module_;
  std::string path_;
  GraphBuilder& graph_;
};

// Appends the ONNX nodes of the module in `scope` that compute its forward() of `input` (a value
// name in the graph); returns the name of its output value.
using Emitter = std::function<std::string(Scope& scope, const std::string& input)>;

// Module type -> emitter. See Note [Export by module type].
class EmitterRegistry {
 public:
  // An empty registry; with_builtins() is the usual start.
  EmitterRegistry() = default;
  // The emitters for LibTorch's common layers (Linear, Conv2d, BatchNorm2d, ReLU, MaxPool2d,
  // AvgPool2d, AdaptiveAvgPool2d to 1x1, Flatten, Dropout, Identity, Sequential) and lockstep's
  // reference models (mlp, convnet with its channels-last pooling, resnet18).
  static EmitterRegistry with_builtins();

  // For modules of type T or derived from it (a later add wins over an earlier one):
  //   registry.add<MyGeluImpl>([](const MyGeluImpl&, Scope& s, const std::string& x) {
  //     return s.op("Gelu", {x});   // opset 20; compose Erf, Mul, Add at opset 17
  //   });
  template <typename T, typename F>
  void add(F emit) {
    typed_.push_back({[](const torch::nn::Module& m) { return dynamic_cast<const T*>(&m) != nullptr; },
                      [emit](Scope& s, const std::string& x) {
                        return emit(dynamic_cast<const T&>(s.module()), s, x);
                      }});
  }
  // For modules whose Module::name() (the demangled C++ type) is exactly `type_name`: the way to
  // reach a type that cannot be named, e.g. one in an anonymous namespace. Wins over add<T>.
  void add(const std::string& type_name, Emitter emit);

  // The emitter for `module`, or nullptr.
  const Emitter* find(const torch::nn::Module& module) const;

 private:
  struct Typed {
    std::function<bool(const torch::nn::Module&)> matches;
    Emitter emit;
  };
  std::map<std::string, Emitter> by_name_;
  std::vector<Typed> typed_;
};

// The builtins of with_builtins(), in two groups.
void add_layer_emitters(EmitterRegistry& registry);
void add_reference_model_emitters(EmitterRegistry& registry);

// The graph under construction: unique node and value names, initializers, the registry.
class GraphBuilder {
 public:
  GraphBuilder(onnx::GraphProto& graph, const EmitterRegistry& registry);

  // Emits `module` at `path` on `input`; returns its output. Throws c10::Error naming the module's
  // type and path when the registry has no emitter for it.
  std::string emit(const torch::nn::Module& module, const std::string& path, const std::string& input);

  onnx::NodeProto& add_node(const std::string& op_type, const std::vector<std::string>& inputs,
                            const std::string& scope_path, const std::string& doc);
  // Throws when `name` is taken (two initializers under one key would be a malformed export).
  std::string add_initializer(const std::string& name, const torch::Tensor& value);

  onnx::GraphProto& graph() { return graph_; }

 private:
  onnx::GraphProto& graph_;
  const EmitterRegistry& registry_;
  std::map<std::string, int64_t> node_names_;  // name -> times used
  std::map<std::string, bool> initializer_names_;
};

// Helpers for emitters: attributes on a node.
void set_attribute(onnx::NodeProto& node, const std::string& name, int64_t value);
void set_attribute(onnx::NodeProto& node, const std::string& name, float value);
void set_attribute(onnx::NodeProto& node, const std::string& name, const std::vector<int64_t>& values);

// A CPU tensor as an ONNX TensorProto (fp32 or int64, raw little-endian data), and back.
onnx::TensorProto to_tensor_proto(const std::string& name, const torch::Tensor& value);
torch::Tensor from_tensor_proto(const onnx::TensorProto& proto);

}  // namespace lockstep::exporting
