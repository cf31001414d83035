#include "lockstep/serve/http_protocol.h"

#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <charconv>
#include <cmath>
#include <cstring>

#include "json_scan.h"

namespace lockstep::serve {
namespace {

using json_scan::Layout;
using json_scan::ScannedBody;
using json_scan::scan_body;

constexpr int kBadRequest = 400;
constexpr size_t kFp32Bytes = sizeof(float);

[[noreturn]] void bad_request(const std::string& message) { throw HttpError(kBadRequest, message); }

std::string shape_text(const std::vector<int64_t>& shape) { return "[" + c10::Join(", ", shape) + "]"; }

// The shape a request's input must have, "[-1, 1, 28, 28]" (-1: 1 to max_batch_size samples).
std::string expected_shape(const ModelConfig& config) {
  std::vector<int64_t> shape{-1};
  shape.insert(shape.end(), config.input.dims.begin(), config.input.dims.end());
  return shape_text(shape) + " with at most " + std::to_string(config.max_batch_size) + " samples";
}

const nlohmann::json* member(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

// Refuses parameters this server would otherwise ignore (e.g. "classification",
// "shared_memory_region"): a client must not take a result computed without them for one with.
void check_parameters(const nlohmann::json& object, const std::string& what, const char* supported) {
  const nlohmann::json* parameters = member(object, "parameters");
  if (parameters == nullptr) return;
  if (!parameters->is_object()) bad_request(what + " \"parameters\" must be an object, got " + parameters->dump());
  for (const auto& item : parameters->items())
    if (item.key() != supported)
      bad_request(what + " parameter '" + item.key() + "' is not supported by this server (it reads only '" +
                  supported + "' there)");
}

bool bool_parameter(const nlohmann::json& object, const char* key) {
  const nlohmann::json* parameters = member(object, "parameters");
  if (parameters == nullptr || !parameters->is_object()) return false;
  const nlohmann::json* value = member(*parameters, key);
  if (value == nullptr) return false;
  if (!value->is_boolean()) bad_request(std::string("parameter '") + key + "' must be true or false, got " + value->dump());
  return value->get<bool>();
}


// Appends the numbers of `data`, flat or nested to any depth, to `out`.
void flatten(const nlohmann::json& data, std::vector<float>& out, const std::string& name, Layout& layout,
             size_t depth = 0) {
  if (data.is_number()) {
    out.push_back(data.get<float>());
    layout.number(depth);
  } else if (data.is_array()) {
    layout.arrays.emplace_back(depth + 1, data.size());
    for (const nlohmann::json& item : data) flatten(item, out, name, layout, depth + 1);
  } else {
    bad_request("input '" + name + "' data holds " + std::string(data.type_name()) + " " +
                data.dump().substr(0, 40) + "; FP32 data is numbers (a flat or nested array)");
  }
}

std::vector<int64_t> read_shape(const nlohmann::json& input, const std::string& name, const ModelConfig& config) {
  const nlohmann::json* shape = member(input, "shape");
  if (shape == nullptr || !shape->is_array()) bad_request("input '" + name + "' has no \"shape\" array");
  std::vector<int64_t> dims;
  for (const nlohmann::json& d : *shape) {
    if (!d.is_number_integer()) bad_request("input '" + name + "' shape " + shape->dump() + " holds a non-integer");
    dims.push_back(d.get<int64_t>());
  }
  const bool fits = dims.size() == config.input.dims.size() + 1 && dims[0] >= 1 && dims[0] <= config.max_batch_size &&
                    std::equal(config.input.dims.begin(), config.input.dims.end(), dims.begin() + 1);
  if (!fits)
    bad_request("input '" + name + "' has shape " + shape_text(dims) + "; model '" + config.name + "' takes " +
                expected_shape(config));
  return dims;
}

// Data is flat, or nested exactly as the shape; every number within FP32's range.
void check_values(const std::vector<float>& values, const Layout& layout, const std::vector<int64_t>& shape,
                  const std::string& name) {
  const bool flat = !layout.uneven && layout.number_depth <= 1 && layout.arrays.size() <= 1;
  bool as_shape = !layout.uneven && layout.number_depth == shape.size();
  for (const auto& [depth, length] : layout.arrays)
    as_shape = as_shape && depth <= shape.size() && static_cast<int64_t>(length) == shape[depth - 1];
  if (!flat && !as_shape)
    bad_request("input '" + name + "' data is nested unlike its shape " + shape_text(shape) +
                "; send the values flat, or nested exactly as the shape");
  for (size_t k = 0; k < values.size(); ++k)
    if (!std::isfinite(values[k]))
      bad_request("input '" + name + "' value " + std::to_string(k) + " is outside FP32's range (magnitude at most " +
                  "3.4028235e38)");
}


}  // namespace

InferRequest parse_infer_request(const std::string& body, std::optional<size_t> header_length,
                                 const ModelConfig& config) {
  if (header_length && *header_length > body.size())
    bad_request("Inference-Header-Content-Length " + std::to_string(*header_length) + " is more than the body's " +
                std::to_string(body.size()) + " bytes");
  const size_t json_bytes = header_length.value_or(body.size());
  ScannedBody scanned = scan_body(body.data(), json_bytes);
  nlohmann::json j = nlohmann::json::parse(scanned.json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    try {  // the message and its byte offset from the body as sent
      [[maybe_unused]] const nlohmann::json as_sent =
          nlohmann::json::parse(body.begin(), body.begin() + static_cast<std::ptrdiff_t>(json_bytes));
    } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number beyond double's range
      bad_request(std::string("malformed JSON in the request body: ") + e.what());
    }
    bad_request("malformed JSON in the request body");
  }
  if (!j.is_object()) bad_request("the request body must be a JSON object with \"inputs\", got " + std::string(j.type_name()));

  InferRequest request;
  if (const nlohmann::json* id = member(j, "id")) {
    if (!id->is_string()) bad_request("\"id\" must be a string, got " + id->dump());
    request.id = id->get<std::string>();
  }
  const nlohmann::json* inputs = member(j, "inputs");
  if (inputs == nullptr || !inputs->is_array() || inputs->empty())
    bad_request("the request has no \"inputs\" array; model '" + config.name + "' takes input '" + config.input.name + "'");
  if (inputs->size() != 1)
    bad_request("the request has " + std::to_string(inputs->size()) + " inputs; model '" + config.name +
                "' takes one, '" + config.input.name + "'");
  const nlohmann::json& input = (*inputs)[0];
  if (!input.is_object()) bad_request("each of \"inputs\" must be an object with name, shape, datatype and data");
  const nlohmann::json* name = member(input, "name");
  if (name == nullptr || !name->is_string()) bad_request("an input has no \"name\"");
  if (*name != config.input.name)
    bad_request("unknown input '" + name->get<std::string>() + "'; model '" + config.name + "' takes '" +
                config.input.name + "'");
  const std::string& input_name = config.input.name;
  const nlohmann::json* datatype = member(input, "datatype");
  if (datatype == nullptr || !datatype->is_string() || *datatype != config.input.datatype)
    bad_request("input '" + input_name + "' has datatype " + (datatype == nullptr ? "(none)" : datatype->dump()) +
                "; model '" + config.name + "' takes " + config.input.datatype);
  const std::vector<int64_t> shape = read_shape(input, input_name, config);
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;

  check_parameters(input, "input '" + input_name + "'", "binary_data_size");
  request.input = torch::empty(shape, torch::kFloat);
  const nlohmann::json* parameters = member(input, "parameters");
  const nlohmann::json* binary_size = parameters != nullptr && parameters->is_object()
                                          ? member(*parameters, "binary_data_size") : nullptr;
  if (binary_size != nullptr) {
    if (!header_length)
      bad_request("input '" + input_name + "' has binary_data_size but the request has no Inference-Header-Content-Length header");
    if (!binary_size->is_number_unsigned())
      bad_request("input '" + input_name + "' binary_data_size must be a byte count, got " + binary_size->dump());
    const size_t bytes = binary_size->get<size_t>();
    const size_t expected = static_cast<size_t>(elements) * kFp32Bytes;
    if (bytes != expected)
      bad_request("input '" + input_name + "' binary_data_size " + std::to_string(bytes) + " does not match shape " +
                  shape_text(shape) + " of FP32, which is " + std::to_string(expected) + " bytes");
    if (body.size() - json_bytes != bytes)
      bad_request("the body holds " + std::to_string(body.size() - json_bytes) +
                  " bytes after the JSON header, but the inputs' binary_data_size add up to " + std::to_string(bytes));
    std::memcpy(request.input.data_ptr<float>(), body.data() + json_bytes, bytes);
  } else {
    if (header_length && body.size() != json_bytes)
      bad_request("the body holds " + std::to_string(body.size() - json_bytes) +
                  " bytes after the JSON header, but no input has binary_data_size");
    const nlohmann::json* data = member(input, "data");
    if (data == nullptr) bad_request("input '" + input_name + "' has neither \"data\" nor parameters.binary_data_size");
    std::vector<float> values;
    Layout layout;
    if (!scanned.inputs.empty() && scanned.input_index[0] == 0 && data->is_null()) {
      values = std::move(scanned.inputs[0]);  // read by scan_body
      layout = std::move(scanned.layouts[0]);
    } else {
      values.reserve(static_cast<size_t>(elements));
      flatten(*data, values, input_name, layout);
    }
    check_values(values, layout, shape, input_name);
    if (static_cast<int64_t>(values.size()) != elements)
      bad_request("input '" + input_name + "' has " + std::to_string(values.size()) + " values; shape " +
                  shape_text(shape) + " needs " + std::to_string(elements));
    std::memcpy(request.input.data_ptr<float>(), values.data(), values.size() * kFp32Bytes);
  }

  check_parameters(j, "the request's", "binary_data_output");
  request.binary_output = bool_parameter(j, "binary_data_output");
  if (const nlohmann::json* outputs = member(j, "outputs")) {
    if (!outputs->is_array()) bad_request("\"outputs\" must be an array");
    for (const nlohmann::json& output : *outputs) {
      const nlohmann::json* out_name = output.is_object() ? member(output, "name") : nullptr;
      if (out_name == nullptr || *out_name != config.output.name)
        bad_request("unknown output " + (out_name == nullptr ? std::string("(no name)") : out_name->dump()) +
                    "; model '" + config.name + "' returns '" + config.output.name + "'");
      check_parameters(output, "output '" + config.output.name + "'", "binary_data");
      request.binary_output = bool_parameter(output, "binary_data") || request.binary_output;
    }
  }
  return request;
}

InferResponse make_infer_response(const InferRequest& request, const ModelConfig& config, int64_t version,
                                  const torch::Tensor& output) {
  const torch::Tensor values = output.to(torch::kFloat).contiguous();
  nlohmann::json out{{"name", config.output.name}, {"datatype", config.output.datatype}, {"shape", values.sizes().vec()}};
  const size_t bytes = static_cast<size_t>(values.numel()) * kFp32Bytes;
  if (request.binary_output) {
    out["parameters"] = {{"binary_data_size", bytes}};
  } else {
    const float* p = values.data_ptr<float>();
    out["data"] = std::vector<float>(p, p + values.numel());
  }
  nlohmann::json j{{"model_name", config.name}, {"model_version", std::to_string(version)}, {"outputs", {out}}};
  if (!request.id.empty()) j["id"] = request.id;
  InferResponse response{j.dump(), "application/json", std::nullopt};
  if (request.binary_output) {
    response.header_length = response.body.size();
    response.body.append(reinterpret_cast<const char*>(values.data_ptr<float>()), bytes);
    response.content_type = "application/octet-stream";
  }
  return response;
}

nlohmann::json server_metadata() {
  return {{"name", "lockstep"}, {"version", "0.1.0"}, {"extensions", {"binary_tensor_data", "statistics"}}};
}

nlohmann::json model_metadata(const ModelConfig& config, const std::vector<int64_t>& versions) {
  auto tensor = [](const TensorSpec& t) {
    std::vector<int64_t> shape{-1};
    shape.insert(shape.end(), t.dims.begin(), t.dims.end());
    return nlohmann::json{{"name", t.name}, {"datatype", t.datatype}, {"shape", shape}};
  };
  std::vector<std::string> names;
  for (int64_t v : versions) names.push_back(std::to_string(v));
  return {{"name", config.name},
          {"versions", names},
          {"platform", config.format == ModelFormat::kTorchScript ? std::string("pytorch_libtorch")
                                                                  : "lockstep_" + config.architecture},
          {"inputs", {tensor(config.input)}},
          {"outputs", {tensor(config.output)}}};
}

std::string error_body(const std::string& message) {
  // A message may quote bytes of the request that are not UTF-8: replaced, never a throw.
  return nlohmann::json{{"error", message}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace lockstep::serve
