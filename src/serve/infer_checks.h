#pragma once
// The checks an infer request passes however it arrives (KServe v2 JSON over HTTP in
// http_protocol.cpp, protobuf over gRPC in grpc_protocol.cpp), with one wording. Private to
// src/serve. Each throws HttpError(400) naming the input and what the model takes.

#include <torch/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "lockstep/serve/batcher.h"
#include "lockstep/serve/model_config.h"

namespace lockstep::serve {

[[noreturn]] void bad_request(const std::string& message);

std::string shape_text(const std::vector<int64_t>& shape);
// "'INPUT__0', 'INPUT__1'"
std::string names_text(const std::vector<TensorSpec>& specs);

// `dims`, the shape a request gives input `spec`: (n, dims...) with 1 <= n <= max_batch_size, or
// the config's dims exactly with max_batch_size 0.
void check_input_shape(const std::vector<int64_t>& dims, const TensorSpec& spec, const ModelConfig& config);

// The bytes a tensor of `spec`'s datatype and `shape` takes on the wire (one per BOOL).
size_t wire_bytes(const TensorSpec& spec, const std::vector<int64_t>& shape);
// A tensor of `spec`'s datatype from `bytes` little-endian bytes at `data` (any nonzero byte is a
// true BOOL); `what` says where they came from ("binary_data_size 12", "raw_input_contents[0]'s 12
// bytes") when their count does not match the shape.
torch::Tensor tensor_from_bytes(const char* data, size_t bytes, const TensorSpec& spec,
                                const std::vector<int64_t>& shape, const std::string& what);

// Every input of `config` is given, each with the same number of samples when batched.
void check_complete(const Tensors& inputs, const ModelConfig& config);

}  // namespace lockstep::serve
