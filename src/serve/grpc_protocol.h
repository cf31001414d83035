#pragma once
// The KServe v2 gRPC messages (grpc_service.proto) read into and written from the server's own
// types: the codec, as http_protocol.h is HTTP's. No sockets here: see grpc_server.h. Private to
// src/serve (the generated types are not part of the installed headers).

#include <cstdint>
#include <vector>

#include "grpc_service.pb.h"
#include "lockstep/serve/http_protocol.h"
#include "lockstep/serve/statistics.h"

namespace lockstep::serve {

// A ModelInfer request for `config`. Each input is named once with the config's datatype and shape;
// its values are either all in raw_input_contents (one entry per input, in the request's order:
// little-endian bytes, one per BOOL) or each in its datatype's contents field (fp32_contents for
// FP32, int64_contents for INT64, int_contents for INT32, bool_contents for BOOL; FP16 and BF16
// only raw). Outputs named in `outputs` (or else all) come back in raw_output_contents. No request,
// input or output parameter is read, so any is refused. Throws HttpError(400) as parse_infer_request
// does, with the same words.
InferRequest parse_grpc_infer_request(const inference::ModelInferRequest& message, const ModelConfig& config);

// The response for `request`, given every output of the config, in its order.
void write_grpc_infer_response(const InferRequest& request, const ModelConfig& config, int64_t version,
                               const Tensors& outputs, inference::ModelInferResponse& response);

void write_model_metadata(const ModelConfig& config, const std::vector<int64_t>& versions,
                          inference::ModelMetadataResponse& response);
// Triton's model configuration message, the fields model_config_json writes.
void write_model_config(const ModelConfig& config, inference::ModelConfig& out);
void write_statistics(const std::string& model, const std::string& version, const ModelStatistics::Snapshot& s,
                      inference::ModelStatistics& out);

}  // namespace lockstep::serve
