#include "lockstep/serve/http_protocol.h"

#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <charconv>
#include <cstring>

namespace lockstep::serve {
namespace {

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

bool bool_parameter(const nlohmann::json& object, const char* key) {
  const nlohmann::json* parameters = member(object, "parameters");
  if (parameters == nullptr || !parameters->is_object()) return false;
  const nlohmann::json* value = member(*parameters, key);
  if (value == nullptr) return false;
  if (!value->is_boolean()) bad_request(std::string("parameter '") + key + "' must be true or false, got " + value->dump());
  return value->get<bool>();
}

// Appends the numbers of `data`, flat or nested to any depth, to `out`.
void flatten(const nlohmann::json& data, std::vector<float>& out, const std::string& name) {
  if (data.is_number()) {
    out.push_back(data.get<float>());
  } else if (data.is_array()) {
    for (const nlohmann::json& item : data) flatten(item, out, name);
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

// Note [Reading tensor data without a JSON DOM]
// A batch-1 request for a 28x28 image is some 10 kB of JSON, almost all of it the 784 numbers of
// inputs[i].data. Parsed into a DOM, each number costs a lexer pass with a token copy, strtod and
// a json node; at concurrency 32 that was a third of the server's CPU (perf, 2026-11-23). So the
// body is scanned once for the structure alone (strings, brackets, the keys on the path
// inputs[i].data); a data array made only of JSON numbers, flat or nested, is read there with
// std::from_chars (into the integer or double nlohmann would hold, then a float, as
// json::get<float> does) and replaced by null in a
// copy of the JSON that the DOM parser then reads. Anything else in that place (a string, a
// number JSON does not allow, one out of double's range) is left in the text, so the DOM parser and
// flatten() report it as before (a parse error is reported from the body as sent): the fast path
// changes speed, never a result or a message.
struct ScannedBody {
  std::string json;                         // the body with each extracted data array as null
  std::vector<std::vector<float>> inputs;   // inputs[i].data for the i-th extracted input
  std::vector<size_t> input_index;          // which input each extracted array belongs to
};

bool json_digit(char c) { return c >= '0' && c <= '9'; }

// Reads a JSON number at text[i..n): the grammar of RFC 8259 (no '+', no leading zeros, no bare
// '.'), then its value as a float the way nlohmann::json does: an integer that fits 64 bits as
// an integer (so "-0" is 0), anything else as a double. Returns false for anything else, or a
// value outside double's range.
bool read_number(const char* text, size_t n, size_t& i, float& value) {
  const size_t start = i;
  if (i < n && text[i] == '-') ++i;
  if (i < n && text[i] == '0') {
    ++i;
  } else {
    if (i >= n || !json_digit(text[i])) return false;
    while (i < n && json_digit(text[i])) ++i;
  }
  bool integer = true;
  if (i < n && text[i] == '.') {
    integer = false;
    if (++i >= n || !json_digit(text[i])) return false;
    while (i < n && json_digit(text[i])) ++i;
  }
  if (i < n && (text[i] == 'e' || text[i] == 'E')) {
    integer = false;
    if (++i < n && (text[i] == '+' || text[i] == '-')) ++i;
    if (i >= n || !json_digit(text[i])) return false;
    while (i < n && json_digit(text[i])) ++i;
  }
  const char *first = text + start, *last = text + i;
  if (integer) {
    int64_t signed_value = 0;
    const auto as_signed = std::from_chars(first, last, signed_value);
    if (as_signed.ec == std::errc() && as_signed.ptr == last) return value = static_cast<float>(signed_value), true;
    uint64_t unsigned_value = 0;
    const auto as_unsigned = std::from_chars(first, last, unsigned_value);
    if (as_unsigned.ec == std::errc() && as_unsigned.ptr == last) return value = static_cast<float>(unsigned_value), true;
  }
  double number = 0.0;
  const auto [end, ec] = std::from_chars(first, last, number);
  value = static_cast<float>(number);
  return ec == std::errc() && end == last;
}

size_t skip_space(const char* text, size_t n, size_t i) {
  while (i < n && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t')) ++i;
  return i;
}

// Reads the array of numbers (nested to any depth) that starts at text[i] == '['; on success
// appends them to `out` and returns the index after its ']'. Returns 0 when it is anything else.
size_t read_number_array(const char* text, size_t n, size_t i, std::vector<float>& out) {
  int depth = 0;
  do {
    i = skip_space(text, n, i);
    if (i < n && text[i] == '[') {  // an array opens: a value or ']' follows
      ++depth, ++i;
      i = skip_space(text, n, i);
      if (i < n && text[i] == ']') {
        --depth, ++i;
      } else {
        continue;
      }
    } else {
      float value = 0.0f;
      if (!read_number(text, n, i, value)) return 0;
      out.push_back(value);
    }
    // After a value: ',' and another value, or ']' closing one or more arrays.
    for (i = skip_space(text, n, i); depth > 0 && i < n && text[i] == ']'; i = skip_space(text, n, i)) --depth, ++i;
    if (depth == 0) return i;
    if (i >= n || text[i] != ',') return 0;
    ++i;
  } while (true);
}

// See Note [Reading tensor data without a JSON DOM]. Malformed JSON is copied as it is, for the
// DOM parser to report.
ScannedBody scan_body(const char* text, size_t n) {
  struct Frame {
    bool object;
    std::string key;  // an object's current key (raw bytes between the quotes)
    size_t index = 0; // an array's current element
  };
  ScannedBody scanned;
  std::vector<Frame> stack;
  size_t copied = 0;  // text[0, copied) is in scanned.json
  bool at_key = false;
  for (size_t i = 0; i < n;) {
    const char c = text[i];
    if (c == '"') {
      const size_t start = ++i;
      while (i < n && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
      if (at_key && !stack.empty()) stack.back().key.assign(text + start, std::min(i, n) - start), at_key = false;
      ++i;
    } else if (c == '{' || c == '[') {
      const bool input_data = c == '[' && stack.size() == 3 && stack[0].object && stack[0].key == "inputs" &&
                              !stack[1].object && stack[2].object && stack[2].key == "data";
      std::vector<float> values;
      const size_t end = input_data ? read_number_array(text, n, i, values) : 0;
      if (end != 0) {
        scanned.json.append(text + copied, i - copied).append("null");
        scanned.inputs.push_back(std::move(values));
        scanned.input_index.push_back(stack[1].index);
        copied = i = end;
        continue;
      }
      stack.push_back({c == '{', "", 0});
      at_key = c == '{';
      ++i;
    } else if (c == '}' || c == ']') {
      if (!stack.empty()) stack.pop_back();
      at_key = false;
      ++i;
    } else if (c == ',') {
      if (!stack.empty() && stack.back().object) at_key = true;
      if (!stack.empty() && !stack.back().object) ++stack.back().index;
      ++i;
    } else {
      ++i;
    }
  }
  scanned.json.append(text + copied, n - copied);
  return scanned;
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
      (void)nlohmann::json::parse(body.begin(), body.begin() + static_cast<std::ptrdiff_t>(json_bytes));
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
    if (!scanned.inputs.empty() && scanned.input_index[0] == 0 && data->is_null()) {
      values = std::move(scanned.inputs[0]);  // read by scan_body
    } else {
      values.reserve(static_cast<size_t>(elements));
      flatten(*data, values, input_name);
    }
    if (static_cast<int64_t>(values.size()) != elements)
      bad_request("input '" + input_name + "' has " + std::to_string(values.size()) + " values; shape " +
                  shape_text(shape) + " needs " + std::to_string(elements));
    std::memcpy(request.input.data_ptr<float>(), values.data(), values.size() * kFp32Bytes);
  }

  request.binary_output = bool_parameter(j, "binary_data_output");
  if (const nlohmann::json* outputs = member(j, "outputs")) {
    if (!outputs->is_array()) bad_request("\"outputs\" must be an array");
    for (const nlohmann::json& output : *outputs) {
      const nlohmann::json* out_name = output.is_object() ? member(output, "name") : nullptr;
      if (out_name == nullptr || *out_name != config.output.name)
        bad_request("unknown output " + (out_name == nullptr ? std::string("(no name)") : out_name->dump()) +
                    "; model '" + config.name + "' returns '" + config.output.name + "'");
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
          {"platform", "lockstep_" + config.architecture},
          {"inputs", {tensor(config.input)}},
          {"outputs", {tensor(config.output)}}};
}

std::string error_body(const std::string& message) {
  // A message may quote bytes of the request that are not UTF-8: replaced, never a throw.
  return nlohmann::json{{"error", message}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace lockstep::serve
