#include "lockstep/serve/http_protocol.h"

#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>

#include "json_kind.h"
#include "infer_checks.h"
#include "json_scan.h"

namespace lockstep::serve {
namespace {

using json_scan::Layout;
using json_scan::ScannedBody;
using json_scan::scan_body;

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

std::optional<bool> bool_parameter(const nlohmann::json& object, const char* key) {
  const nlohmann::json* parameters = member(object, "parameters");
  if (parameters == nullptr || !parameters->is_object()) return std::nullopt;
  const nlohmann::json* value = member(*parameters, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_boolean()) bad_request(std::string("parameter '") + key + "' must be true or false, got " + value->dump());
  return value->get<bool>();
}

// How JSON writes a datatype's values: numbers (FP32, FP16, BF16), integers (INT64, INT32) or
// true/false (BOOL).
// The values of one input's "data", flat, read as its datatype's JSON kind (doubles hold FP32
// numbers exactly as get<float> rounds them; int64 holds integers and booleans).
struct Values {
  std::vector<float> numbers;
  std::vector<int64_t> integers;
  Layout layout;
};

// Appends the values of `data`, flat or nested to any depth, to `out`.
void flatten(const nlohmann::json& data, JsonKind kind, Values& out, const std::string& name,
             const std::string& datatype, size_t depth = 0) {
  if (data.is_array()) {
    out.layout.arrays.emplace_back(depth + 1, data.size());
    for (const nlohmann::json& item : data) flatten(item, kind, out, name, datatype, depth + 1);
    return;
  }
  const char* expected = "numbers";
  if (kind == JsonKind::kNumber && data.is_number()) {
    out.numbers.push_back(data.get<float>());
  } else if (kind == JsonKind::kInteger && data.is_number_integer() &&
             !(data.is_number_unsigned() && data.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
    out.integers.push_back(data.get<int64_t>());
  } else if (kind == JsonKind::kBoolean && data.is_boolean()) {
    out.integers.push_back(data.get<bool>() ? 1 : 0);
  } else {
    expected = kind == JsonKind::kInteger ? "integers (within INT64)" : kind == JsonKind::kBoolean ? "true or false" : expected;
    bad_request("input '" + name + "' data holds " + std::string(data.type_name()) + " " + data.dump().substr(0, 40) +
                "; " + datatype + " data is " + expected + " (a flat or nested array)");
  }
  out.layout.number(depth);
}

std::vector<int64_t> read_shape(const nlohmann::json& input, const TensorSpec& spec, const ModelConfig& config) {
  const nlohmann::json* shape = member(input, "shape");
  if (shape == nullptr || !shape->is_array()) bad_request("input '" + spec.name + "' has no \"shape\" array");
  std::vector<int64_t> dims;
  for (const nlohmann::json& d : *shape) {
    if (!d.is_number_integer()) bad_request("input '" + spec.name + "' shape " + shape->dump() + " holds a non-integer");
    dims.push_back(d.get<int64_t>());
  }
  check_input_shape(dims, spec, config);
  return dims;
}

// Data is flat, or nested exactly as the shape, and has the shape's number of values.
void check_layout(const Layout& layout, size_t values, const std::vector<int64_t>& shape, const std::string& name) {
  const bool flat = !layout.uneven && layout.number_depth <= 1 && layout.arrays.size() <= 1;
  bool as_shape = !layout.uneven && layout.number_depth == shape.size();
  for (const auto& [depth, length] : layout.arrays)
    as_shape = as_shape && depth <= shape.size() && static_cast<int64_t>(length) == shape[depth - 1];
  if (!flat && !as_shape)
    bad_request("input '" + name + "' data is nested unlike its shape " + shape_text(shape) +
                "; send the values flat, or nested exactly as the shape");
  const int64_t elements = c10::multiply_integers(shape);
  if (static_cast<int64_t>(values) != elements)
    bad_request("input '" + name + "' has " + std::to_string(values) + " values; shape " + shape_text(shape) +
                " needs " + std::to_string(elements));
}

// `values` as a tensor of `spec`'s datatype, every value within its range.
torch::Tensor typed_tensor(Values& values, const TensorSpec& spec, const std::vector<int64_t>& shape) {
  const c10::ScalarType type = scalar_type(spec.datatype);
  if (json_kind(type) == JsonKind::kNumber) {
    const torch::Tensor t = torch::from_blob(values.numbers.data(), shape, torch::kFloat).to(type, false, true);
    const torch::Tensor finite = torch::isfinite(t).flatten();
    if (!finite.all().item<bool>()) {
      const int64_t k = (~finite).nonzero()[0].item<int64_t>();
      const char* max = type == torch::kHalf ? "65504" : type == torch::kBFloat16 ? "3.3895314e38" : "3.4028235e38";
      bad_request("input '" + spec.name + "' value " + std::to_string(k) + " is outside " + spec.datatype +
                  "'s range (magnitude at most " + max + ")");
    }
    return t;
  }
  if (type == torch::kInt)
    for (size_t k = 0; k < values.integers.size(); ++k)
      if (values.integers[k] < INT32_MIN || values.integers[k] > INT32_MAX)
        bad_request("input '" + spec.name + "' value " + std::to_string(k) + ", " + std::to_string(values.integers[k]) +
                    ", is outside INT32's range");
  return torch::from_blob(values.integers.data(), shape, torch::kLong).to(type, false, true);
}

// Input `i` of the request, `spec`, read from its JSON data.
torch::Tensor json_input(const nlohmann::json& input, size_t i, const TensorSpec& spec,
                         const std::vector<int64_t>& shape, ScannedBody& scanned, const std::string& body) {
  const nlohmann::json* data = member(input, "data");
  if (data == nullptr) bad_request("input '" + spec.name + "' has neither \"data\" nor parameters.binary_data_size");
  const JsonKind kind = json_kind(scalar_type(spec.datatype));
  Values values;
  const auto extracted = std::find(scanned.input_index.begin(), scanned.input_index.end(), i);
  const size_t k = static_cast<size_t>(extracted - scanned.input_index.begin());
  if (extracted != scanned.input_index.end() && data->is_null() && kind == JsonKind::kNumber) {
    values.numbers = std::move(scanned.inputs[k]);  // read by scan_body
    values.layout = std::move(scanned.layouts[k]);
  } else if (extracted != scanned.input_index.end() && data->is_null()) {  // integers: read again, exactly
    const auto [begin, end] = scanned.spans[k];
    flatten(nlohmann::json::parse(body.begin() + static_cast<std::ptrdiff_t>(begin),
                                  body.begin() + static_cast<std::ptrdiff_t>(end)),
            kind, values, spec.name, spec.datatype);
  } else {
    flatten(*data, kind, values, spec.name, spec.datatype);
  }
  check_layout(values.layout, kind == JsonKind::kNumber ? values.numbers.size() : values.integers.size(), shape,
               spec.name);
  return typed_tensor(values, spec, shape);
}

// The bytes of binary data the request's inputs declare, in all.
size_t declared_binary_bytes(const nlohmann::json& inputs) {
  size_t total = 0;
  for (const nlohmann::json& input : inputs) {
    const nlohmann::json* parameters = input.is_object() ? member(input, "parameters") : nullptr;
    const nlohmann::json* size = parameters != nullptr && parameters->is_object()
                                     ? member(*parameters, "binary_data_size") : nullptr;
    if (size != nullptr && size->is_number_unsigned()) total += size->get<size_t>();
  }
  return total;
}

// Input `spec`'s little-endian bytes at body[offset, offset + bytes); the JSON header is
// body[0, json_bytes) and the inputs declare `declared` bytes after it.
torch::Tensor binary_input(const nlohmann::json& size, const TensorSpec& spec, const std::vector<int64_t>& shape,
                           const std::string& body, size_t json_bytes, size_t declared, size_t offset) {
  if (!size.is_number_unsigned())
    bad_request("input '" + spec.name + "' binary_data_size must be a byte count, got " + size.dump());
  const size_t bytes = size.get<size_t>();
  if (bytes == wire_bytes(spec, shape) && offset + bytes > body.size())
    bad_request("the body holds " + std::to_string(body.size() - json_bytes) +
                " bytes after the JSON header, but the inputs' binary_data_size add up to " + std::to_string(declared));
  return tensor_from_bytes(body.data() + offset, bytes, spec, shape, "binary_data_size " + std::to_string(bytes));
}

// The request's "outputs": which of the config's outputs the response holds, and how.
std::vector<RequestedOutput> requested_outputs(const nlohmann::json& j, const ModelConfig& config) {
  check_parameters(j, "the request's", "binary_data_output");
  const bool binary = bool_parameter(j, "binary_data_output").value_or(false);
  std::vector<RequestedOutput> out;
  const nlohmann::json* outputs = member(j, "outputs");
  if (outputs == nullptr) {
    for (size_t i = 0; i < config.outputs.size(); ++i) out.push_back({i, binary});
    return out;
  }
  if (!outputs->is_array()) bad_request("\"outputs\" must be an array");
  for (const nlohmann::json& output : *outputs) {
    const nlohmann::json* name = output.is_object() ? member(output, "name") : nullptr;
    const auto spec = std::find_if(config.outputs.begin(), config.outputs.end(),
                                   [&](const TensorSpec& t) { return name != nullptr && *name == t.name; });
    if (spec == config.outputs.end())
      bad_request("unknown output " + (name == nullptr ? std::string("(no name)") : name->dump()) + "; model '" +
                  config.name + "' returns " + names_text(config.outputs));
    const size_t index = static_cast<size_t>(spec - config.outputs.begin());
    for (const RequestedOutput& r : out)
      if (r.index == index) bad_request("output '" + spec->name + "' is asked for twice");
    check_parameters(output, "output '" + spec->name + "'", "binary_data");
    out.push_back({index, bool_parameter(output, "binary_data").value_or(binary)});
  }
  return out;
}

}  // namespace

InferRequest parse_infer_request(const std::string& body, std::optional<size_t> header_length,
                                 const ModelConfig& config) {
  if (header_length && *header_length > body.size())
    bad_request("Inference-Header-Content-Length " + std::to_string(*header_length) + " is more than the body's " +
                std::to_string(body.size()) + " bytes");
  const size_t json_bytes = header_length.value_or(body.size());
  ScannedBody scanned = scan_body(body.data(), json_bytes, config.inputs.size());
  // Each input is named once, so more entries than the model's inputs are refused before the DOM
  // is built (10^6 of them made a 0.9 GB DOM over 4 s); a body cut short is still reported as
  // malformed JSON (a syntax error inside a well-nested one is not looked for).
  if (scanned.input_entries > config.inputs.size() && scanned.balanced)
    bad_request("the request has " + std::to_string(scanned.input_entries) + " inputs; model '" + config.name +
                "' takes " + std::to_string(config.inputs.size()) + " (" + names_text(config.inputs) +
                "), each named once");
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
    bad_request("the request has no \"inputs\" array; model '" + config.name + "' takes " + names_text(config.inputs));
  request.inputs.resize(config.inputs.size());
  size_t offset = json_bytes;  // of the next input's binary data
  for (size_t i = 0; i < inputs->size(); ++i) {
    const nlohmann::json& input = (*inputs)[i];
    if (!input.is_object()) bad_request("each of \"inputs\" must be an object with name, shape, datatype and data");
    const nlohmann::json* name = member(input, "name");
    if (name == nullptr || !name->is_string()) bad_request("an input has no \"name\"");
    const auto spec = std::find_if(config.inputs.begin(), config.inputs.end(),
                                   [&](const TensorSpec& t) { return *name == t.name; });
    if (spec == config.inputs.end())
      bad_request("unknown input '" + name->get<std::string>() + "'; model '" + config.name + "' takes " +
                  names_text(config.inputs));
    torch::Tensor& tensor = request.inputs[static_cast<size_t>(spec - config.inputs.begin())];
    if (tensor.defined()) bad_request("input '" + spec->name + "' is given twice");
    const nlohmann::json* datatype = member(input, "datatype");
    if (datatype == nullptr || !datatype->is_string() || *datatype != spec->datatype)
      bad_request("input '" + spec->name + "' has datatype " + (datatype == nullptr ? "(none)" : datatype->dump()) +
                  "; model '" + config.name + "' takes " + spec->datatype);
    const std::vector<int64_t> shape = read_shape(input, *spec, config);
    check_parameters(input, "input '" + spec->name + "'", "binary_data_size");
    const nlohmann::json* parameters = member(input, "parameters");
    const nlohmann::json* binary_size = parameters != nullptr ? member(*parameters, "binary_data_size") : nullptr;
    if (binary_size != nullptr && member(input, "data") != nullptr)  // as Triton refuses them
      bad_request("input '" + spec->name + "' has both \"data\" and parameters.binary_data_size; give its values " +
                  "in one of them: JSON in \"data\", or binary_data_size bytes after the JSON header");
    if (binary_size == nullptr) {
      tensor = json_input(input, i, *spec, shape, scanned, body);
    } else {
      if (!header_length)
        bad_request("input '" + spec->name + "' has binary_data_size but the request has no Inference-Header-Content-Length header");
      tensor = binary_input(*binary_size, *spec, shape, body, json_bytes, declared_binary_bytes(*inputs), offset);
      offset += static_cast<size_t>(tensor.numel()) * c10::elementSize(tensor.scalar_type());
    }
  }
  if (offset != body.size())
    bad_request("the body holds " + std::to_string(body.size() - json_bytes) + " bytes after the JSON header, but " +
                (offset == json_bytes ? std::string("no input has binary_data_size")
                                      : "the inputs' binary_data_size add up to " + std::to_string(offset - json_bytes)));
  check_complete(request.inputs, config);
  request.outputs = requested_outputs(j, config);
  return request;
}

}  // namespace lockstep::serve
