#pragma once
// The KServe v2 REST protocol's messages (https://kserve.github.io/website/ "Open Inference
// Protocol"), with the binary tensor data extension: parsing an infer request into tensors and
// writing the response, metadata and errors. No sockets here: see http_service.h.

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "lockstep/serve/batcher.h"
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

// One output a response carries: the config's output `index`, as raw little-endian bytes after the
// JSON header (`binary`) or as JSON values.
struct RequestedOutput {
  size_t index = 0;
  bool binary = false;
};

struct InferRequest {
  std::string id;  // echoed in the response when given
  // The config's inputs in its order, each (n, dims...) of its datatype with one n,
  // 1 <= n <= max_batch_size; with max_batch_size 0, (dims...).
  Tensors inputs;
  // What the response holds, in order: the outputs the request names, or else all of them.
  std::vector<RequestedOutput> outputs;
};

// Parses a POST .../infer body for `config`. `header_length`: the Inference-Header-Content-Length
// header, when given: the body is that many bytes of JSON, then the inputs' binary data in order.
// Each input is named once, with the config's datatype and shape; its data is JSON values (numbers,
// integers for INT64/INT32, true/false for BOOL; flat, or nested as the shape) or, with
// "parameters": {"binary_data_size": bytes}, little-endian bytes of the datatype (one byte per
// BOOL). "outputs": [{"name": ...}] picks outputs, each optionally {"parameters": {"binary_data":
// true}}; the request's {"parameters": {"binary_data_output": true}} makes binary every output that
// does not say. Throws HttpError(400) naming the input or output, what is wrong and what the model
// takes.
InferRequest parse_infer_request(const std::string& body, std::optional<size_t> header_length,
                                 const ModelConfig& config);

struct InferResponse {
  std::string body;
  std::string content_type;
  std::optional<size_t> header_length;  // set when binary data follows the JSON header
};

// The response for `request`, given every output of the config, in its order, as the model returned
// them for the request.
InferResponse make_infer_response(const InferRequest& request, const ModelConfig& config, int64_t version,
                                  const Tensors& outputs);

// GET /v2: name, version and the protocol extensions served.
nlohmann::json server_metadata();
// What metadata calls the model's platform: "pytorch_libtorch" (TorchScript, as Triton's PyTorch
// backend) or "lockstep_<architecture>".
std::string model_platform(const ModelConfig& config);
// GET /v2/models/{m}[/versions/{v}]: every input and output, with -1 for the batch dimension
// (none when max_batch_size is 0).
nlohmann::json model_metadata(const ModelConfig& config, const std::vector<int64_t>& versions);
// GET /v2/models/{m}[/versions/{v}]/config: the settings served, in the JSON form of Triton's
// model_config.proto (its field names; integers as numbers, as Triton writes them), which
// tritonclient's get_model_config() returns.
nlohmann::json model_config_json(const ModelConfig& config);
// {"error": message}
std::string error_body(const std::string& message);

}  // namespace lockstep::serve
