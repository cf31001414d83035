#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>

namespace lockstep::exporting {

// Folds each inference BatchNormalization into the Conv that feeds it, when that Conv's output
// goes nowhere else and every weight involved is an initializer: with s = scale / sqrt(var + eps)
// per output channel,
//   W' = W * s (over each output channel's filter),  b' = (b - mean) * s + shift   (b = 0 if absent)
// computed in double and stored as fp32; the Conv takes over the BatchNormalization's output name
// and the now unused initializers are removed. Returns how many were folded. The graph computes
// the same function up to fp32 rounding.
int64_t fold_batch_norm(onnx::GraphProto& graph);

}  // namespace lockstep::exporting
