#pragma once

#include <onnx/onnx_pb.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/export/emitter_registry.h"

namespace lockstep::exporting {

using Metadata = std::vector<std::pair<std::string, std::string>>;  // key, value

constexpr int64_t kOpsetVersion = 17;  // the newest Debian's ONNX 1.12 checks
constexpr int64_t kIrVersion = 8;      // ONNX 1.12's IR

// lockstep's version (CMake's project version), as written into exported files.
const char* lockstep_version();

struct ExportOptions {
  TORCH_ARG(std::string, model_name) = "model";        // the graph's name and metadata "model"
  TORCH_ARG(std::vector<int64_t>, input_shape);        // (C, H, W) of one sample; the batch is dynamic
  TORCH_ARG(bool, fold_batch_norm) = false;            // see fold_batch_norm.h
  TORCH_ARG(std::string, input_name) = "input";
  TORCH_ARG(std::string, output_name) = "logits";
  TORCH_ARG(std::string, doc_string) = "";             // the model's; a default one describes the I/O
  // Extra model metadata (metadata_props), after "model", "lockstep_version" and "fold_batch_norm".
  TORCH_ARG(Metadata, metadata);
};

// The ONNX model (opset 17, fp32) of `model`'s eval-mode forward(): input `input_name` float
// (batch, C, H, W) with a symbolic batch dimension, output `output_name` float (batch, classes),
// parameters and buffers as initializers named by their state-dict keys. The module tree is walked
// through `registry` (Note [Export by module type]). `model` is not modified; its classes count
// comes from one forward of a zero batch. The result is checked (check_model) before it is
// returned. Throws c10::Error naming the module path and type for a layer that cannot be exported.
onnx::ModelProto export_model(const torch::nn::Module& model, const ExportOptions& options,
                              const EmitterRegistry& registry = EmitterRegistry::with_builtins());

// Python's onnx.checker.check_model(model, full_check=True): the checker, then shape inference with
// type checks in strict mode, whose inferred shapes are kept in `model` (graph.value_info). Throws
// c10::Error with the checker's message.
void check_model(onnx::ModelProto& model);

// Serialises `model` and writes it atomically to `path` (see core/atomic_file.h): on any error,
// what was at `path` before is left as it was. Throws c10::Error naming the path and the cause.
void save_model(const onnx::ModelProto& model, const std::string& path);

// Throws c10::ValueError naming `flag`, the path and why when no file can be written at `path`
// (its directory is missing or not writable, or `path` is a directory); for checking an output
// path before any slow work.
void check_output_path(const std::string& flag, const std::string& path);

}  // namespace lockstep::exporting
