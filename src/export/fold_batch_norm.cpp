#include "lockstep/export/fold_batch_norm.h"

#include <torch/torch.h>

#include <map>
#include <set>
#include <string>

#include "lockstep/export/emitter_registry.h"

namespace lockstep::exporting {
namespace {

float float_attribute(const onnx::NodeProto& node, const std::string& name, float fallback) {
  for (const auto& a : node.attribute())
    if (a.name() == name) return a.f();
  return fallback;
}

}  // namespace

int64_t fold_batch_norm(onnx::GraphProto& graph) {
  std::map<std::string, int> initializer_index;
  for (int i = 0; i < graph.initializer_size(); ++i) initializer_index[graph.initializer(i).name()] = i;
  std::map<std::string, int> uses;  // value -> number of node inputs and graph outputs reading it
  for (const auto& node : graph.node())
    for (const auto& in : node.input()) ++uses[in];
  for (const auto& out : graph.output()) ++uses[out.name()];
  std::map<std::string, int> producer;
  for (int i = 0; i < graph.node_size(); ++i)
    for (const auto& out : graph.node(i).output()) producer[out] = i;

  auto weight = [&](const std::string& name) -> torch::Tensor {
    auto it = initializer_index.find(name);
    return it == initializer_index.end() ? torch::Tensor() : from_tensor_proto(graph.initializer(it->second)).to(torch::kDouble);
  };

  std::set<int> removed_nodes;
  int64_t folded = 0;
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& bn = graph.node(i);
    if (bn.op_type() != "BatchNormalization" || bn.input_size() != 5 || bn.output_size() != 1) continue;
    auto p = producer.find(bn.input(0));
    if (p == producer.end() || uses[bn.input(0)] != 1) continue;
    onnx::NodeProto& conv = *graph.mutable_node(p->second);
    if (conv.op_type() != "Conv" || conv.output_size() != 1) continue;
    const torch::Tensor w = weight(conv.input(1));
    const torch::Tensor b = conv.input_size() > 2 ? weight(conv.input(2)) : torch::Tensor();
    const torch::Tensor scale = weight(bn.input(1)), shift = weight(bn.input(2));
    const torch::Tensor mean = weight(bn.input(3)), var = weight(bn.input(4));
    if (!w.defined() || (conv.input_size() > 2 && !b.defined()) || !scale.defined() || !shift.defined() ||
        !mean.defined() || !var.defined() || uses[conv.input(1)] != 1 || (b.defined() && uses[conv.input(2)] != 1))
      continue;
    const double eps = float_attribute(bn, "epsilon", 1e-5f);
    const torch::Tensor s = scale / (var + eps).sqrt();  // (C_out)
    std::vector<int64_t> per_channel(w.dim(), 1);
    per_channel[0] = -1;
    const torch::Tensor folded_w = w * s.reshape(per_channel);
    const torch::Tensor folded_b = ((b.defined() ? b : torch::zeros_like(mean)) - mean) * s + shift;

    *graph.mutable_initializer(initializer_index.at(conv.input(1))) = to_tensor_proto(conv.input(1), folded_w);
    if (b.defined()) {
      *graph.mutable_initializer(initializer_index.at(conv.input(2))) = to_tensor_proto(conv.input(2), folded_b);
    } else {
      // The conv had no bias: it gets one, named after its weight ("conv1.weight" -> "conv1.bias").
      std::string name = conv.input(1);
      const auto dot = name.rfind(".weight");
      name = dot == std::string::npos ? name + "_bias" : name.substr(0, dot) + ".bias";
      while (initializer_index.count(name)) name += "_folded";
      initializer_index[name] = graph.initializer_size();
      *graph.add_initializer() = to_tensor_proto(name, folded_b);
      conv.add_input(name);
      uses[name] = 1;
    }
    conv.set_output(0, bn.output(0));
    conv.set_doc_string(conv.doc_string() + " folded with " + bn.doc_string());
    for (int k = 1; k < 5; ++k) --uses[bn.input(k)];
    removed_nodes.insert(i);
    ++folded;
  }
  if (folded == 0) return 0;

  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
  for (int i = 0; i < graph.node_size(); ++i)
    if (!removed_nodes.count(i)) *kept.Add() = graph.node(i);
  graph.mutable_node()->Swap(&kept);
  google::protobuf::RepeatedPtrField<onnx::TensorProto> live;
  for (const auto& init : graph.initializer())
    if (uses[init.name()] > 0) *live.Add() = init;
  graph.mutable_initializer()->Swap(&live);
  return folded;
}

}  // namespace lockstep::exporting
