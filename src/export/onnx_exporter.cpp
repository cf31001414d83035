#include "lockstep/export/onnx_exporter.h"

#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>
#include <torch/torch.h>

#include <sstream>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/output_path.h"
#include "lockstep/export/fold_batch_norm.h"

namespace lockstep::exporting {
namespace {

constexpr const char* kBatchDim = "batch";

void add_metadata(onnx::ModelProto& model, const std::string& key, const std::string& value) {
  auto* p = model.add_metadata_props();
  p->set_key(key);
  p->set_value(value);
}

// Renames value `from` to `to` wherever a node reads or writes it.
void rename_value(onnx::GraphProto& graph, const std::string& from, const std::string& to) {
  for (auto& node : *graph.mutable_node()) {
    for (auto& in : *node.mutable_input())
      if (in == from) in = to;
    for (auto& out : *node.mutable_output())
      if (out == from) out = to;
  }
}

std::string default_doc(const ExportOptions& o) {
  std::ostringstream s;
  s << "lockstep " << lockstep_version() << " export of '" << o.model_name() << "': " << o.input_name()
    << " float (" << kBatchDim;
  for (int64_t d : o.input_shape()) s << ", " << d;
  s << ") -> " << o.output_name() << " float (" << kBatchDim << ", classes), unnormalised class scores"
    << (o.fold_batch_norm() ? "; batch norm folded into the convolutions" : "");
  return s.str();
}

// Strict shape inference with type checks (the second half of Python's full_check); the inferred
// types land in graph.value_info.
void infer_shapes(onnx::ModelProto& model) {
  try {
    onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(/*check_type=*/true, /*strict_mode=*/1));
  } catch (const std::exception& e) {  // onnx::InferenceError
    TORCH_CHECK(false, "the exported ONNX model of '", model.graph().name(), "' fails the ONNX checker's shape inference: ",
                e.what());
  }
}

}  // namespace

const char* lockstep_version() { return LOCKSTEP_VERSION; }

onnx::ModelProto export_model(const torch::nn::Module& model, const ExportOptions& options,
                              const EmitterRegistry& registry) {
  TORCH_CHECK_VALUE(!options.input_shape().empty(), "export of '", options.model_name(),
                    "': ExportOptions::input_shape (C, H, W of one sample) is not set");
  TORCH_CHECK_VALUE(!options.input_name().empty() && !options.output_name().empty() &&
                        options.input_name() != options.output_name(),
                    "export: input name '", options.input_name(), "' and output name '", options.output_name(),
                    "' must be distinct and not empty");
  onnx::ModelProto proto;
  proto.set_ir_version(kIrVersion);
  proto.set_producer_name("lockstep");
  proto.set_producer_version(lockstep_version());
  proto.set_doc_string(options.doc_string().empty() ? default_doc(options) : options.doc_string());
  auto* opset = proto.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOpsetVersion);
  add_metadata(proto, "model", options.model_name());
  add_metadata(proto, "lockstep_version", lockstep_version());
  add_metadata(proto, "fold_batch_norm", options.fold_batch_norm() ? "true" : "false");
  for (const auto& [key, value] : options.metadata()) add_metadata(proto, key, value);

  onnx::GraphProto& graph = *proto.mutable_graph();
  graph.set_name(options.model_name());
  graph.set_doc_string(proto.doc_string());
  auto* input = graph.add_input();
  input->set_name(options.input_name());
  input->set_doc_string("images as float (pixel / 255 - mean) / stddev, batch first");
  auto* input_type = input->mutable_type()->mutable_tensor_type();
  input_type->set_elem_type(onnx::TensorProto::FLOAT);
  input_type->mutable_shape()->add_dim()->set_dim_param(kBatchDim);
  for (int64_t d : options.input_shape()) input_type->mutable_shape()->add_dim()->set_dim_value(d);

  GraphBuilder builder(graph, registry);
  std::string result = builder.emit(model, "", options.input_name());
  if (result == options.input_name()) result = builder.add_node("Identity", {result}, "", "the model is an identity").output(0);
  rename_value(graph, result, options.output_name());
  if (options.fold_batch_norm()) fold_batch_norm(graph);

  // The output's type is what shape inference finds for the last value (the checker requires a
  // graph output to have a shape), and must be (batch, known sizes...): (batch, classes) for a
  // classifier.
  infer_shapes(proto);
  auto* output = graph.add_output();
  output->set_name(options.output_name());
  output->set_doc_string("class scores (logits), float (batch, classes)");
  for (int i = 0; i < graph.value_info_size(); ++i) {
    if (graph.value_info(i).name() != options.output_name()) continue;
    *output->mutable_type() = graph.value_info(i).type();
    graph.mutable_value_info()->DeleteSubrange(i, 1);
    break;
  }
  TORCH_CHECK(output->has_type(), "export of '", options.model_name(), "': shape inference found no type for the output '",
              options.output_name(), "'");
  check_model(proto);
  const auto& type = graph.output(0).type().tensor_type();
  bool batch_first = type.has_shape() && type.shape().dim_size() >= 1 && type.shape().dim(0).dim_param() == kBatchDim;
  for (int i = 1; batch_first && i < type.shape().dim_size(); ++i) batch_first = type.shape().dim(i).has_dim_value();
  TORCH_CHECK(batch_first, "export of '", options.model_name(), "': shape inference gives the output the shape [",
              type.shape().ShortDebugString(), "], not (", kBatchDim,
              ", sizes known at export); does every layer keep the batch as its first dimension?");
  return proto;
}

void check_model(onnx::ModelProto& model) {
  try {
    onnx::checker::check_model(model);
  } catch (const std::exception& e) {  // onnx::checker::ValidationError
    TORCH_CHECK(false, "the exported ONNX model of '", model.graph().name(), "' fails the ONNX checker: ", e.what());
  }
  infer_shapes(model);
}

void save_model(const onnx::ModelProto& model, const std::string& path) {
  std::string bytes;
  TORCH_CHECK(model.SerializeToString(&bytes), "cannot serialise the ONNX model for '", path,
              "' (protobuf's 2 GiB limit?)");
  write_file_atomic(path, std::vector<char>(bytes.begin(), bytes.end()));
}

void check_output_path(const std::string& flag, const std::string& path) {
  TORCH_CHECK_VALUE(!path.empty(), flag, " is empty; give the file to write");
  check_output_file(flag, path);
}

}  // namespace lockstep::exporting
