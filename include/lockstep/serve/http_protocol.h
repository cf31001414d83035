#pragma once
// The KServe v2 REST protocol's messages (https://kserve.github.io/website/ "Open Inference
// Protocol"), with the binary tensor data extension: parsing an infer request into a tensor and
// writing the response, metadata and errors. No sockets here: see http_service.h.

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "lockstep/serve/model_config.h"

namespace lockstep::serve {

// A request the server refuses: the HTTP status (400, 404, 503, ...) and a message for the client.
class HttpError : public std::runtime_error {
 public:
  HttpError(int status, const std::string& message) : std::runtime_error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

struct InferRequest {
  std::string id;              // echoed in the response when given
  torch::Tensor input;         // (n, dims...) fp32, 1 <= n <= max_batch_size
  bool binary_output = false;  // the output goes as raw bytes after the JSON header
};

// Parses a POST .../infer body for `config`. `header_length`: the Inference-Header-Content-Length
// header, when given: the body is that many bytes of JSON, then the inputs' binary data in order.
// Input data is JSON numbers (flat, or nested as the shape) or, with "parameters":
// {"binary_data_size": bytes}, little-endian FP32 bytes. Throws HttpError(400) naming what is wrong.
InferRequest parse_infer_request(const std::string& body, std::optional<size_t> header_length,
                                 const ModelConfig& config);

struct InferResponse {
  std::string body;
  std::string content_type;
  std::optional<size_t> header_length;  // set when binary data follows the JSON header
};

// The response for `request`, whose output is `output` (n, classes) fp32.
InferResponse make_infer_response(const InferRequest& request, const ModelConfig& config, int64_t version,
                                  const torch::Tensor& output);

// GET /v2: name, version and the protocol extensions served.
nlohmann::json server_metadata();
// GET /v2/models/{m}[/versions/{v}]: the tensors with -1 for the batch dimension.
nlohmann::json model_metadata(const ModelConfig& config, const std::vector<int64_t>& versions);
// {"error": message}
std::string error_body(const std::string& message);

}  // namespace lockstep::serve
