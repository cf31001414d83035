// The KServe v2 HTTP responses (http_protocol.h): inference results, metadata and errors.
#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "json_kind.h"
#include "lockstep/serve/http_protocol.h"

namespace lockstep::serve {
namespace {

// Note [Non-finite outputs in JSON]
// JSON has no NaN or infinity, and nlohmann writes them as null, which a client reads as None:
// a model's NaN became a missing value with a 200. Triton writes them as rapidjson does with
// kWriteNanAndInfFlag, NaN, Infinity and -Infinity (triton-inference-server/server#3870), which
// Python's json, and so tritonclient, reads back as floats. lockstep writes the same: an output
// whose values are not all finite has its "data" written by hand, finite values as nlohmann writes
// them, and the response is joined around it (no placeholder a request's id could imitate).
// Binary outputs carry the bits as they are.
std::string json_numbers_with_non_finite(const torch::Tensor& values) {
  const torch::Tensor v = values.to(torch::kFloat).contiguous();
  const float* p = v.data_ptr<float>();
  std::string out = "[";
  for (int64_t i = 0; i < v.numel(); ++i) {
    if (i > 0) out += ',';
    out += std::isnan(p[i]) ? "NaN"
           : std::isinf(p[i]) ? (p[i] > 0 ? "Infinity" : "-Infinity")
                              : nlohmann::json(static_cast<double>(p[i])).dump();
  }
  return out + "]";
}

// `object` (a JSON object) dumped with `key` set to the JSON text `value`.
std::string with_raw_member(const nlohmann::json& object, const std::string& key, const std::string& value) {
  std::string text = object.dump();
  text.pop_back();  // the closing brace
  return text + (object.empty() ? "" : ",") + nlohmann::json(key).dump() + ":" + value + "}";
}

}  // namespace

InferResponse make_infer_response(const InferRequest& request, const ModelConfig& config, int64_t version,
                                  const Tensors& outputs) {
  std::vector<std::string> texts;  // each output as JSON text
  std::string binary;
  for (const RequestedOutput& r : request.outputs) {
    const TensorSpec& spec = config.outputs.at(r.index);
    const torch::Tensor values = outputs.at(r.index).to(scalar_type(spec.datatype)).contiguous();
    nlohmann::json out{{"name", spec.name}, {"datatype", spec.datatype}, {"shape", values.sizes().vec()}};
    if (r.binary) {
      const size_t bytes = static_cast<size_t>(values.nbytes());
      out["parameters"] = {{"binary_data_size", bytes}};
      binary.append(static_cast<const char*>(values.data_ptr()), bytes);
    } else if (json_kind(values.scalar_type()) == JsonKind::kNumber &&
               !torch::isfinite(values).all().item<bool>()) {  // See Note [Non-finite outputs in JSON]
      texts.push_back(with_raw_member(out, "data", json_numbers_with_non_finite(values)));
      continue;
    } else if (json_kind(values.scalar_type()) == JsonKind::kNumber) {
      const torch::Tensor v = values.to(torch::kFloat);
      out["data"] = std::vector<float>(v.data_ptr<float>(), v.data_ptr<float>() + v.numel());
    } else if (values.scalar_type() == torch::kBool) {
      out["data"] = std::vector<bool>(values.data_ptr<bool>(), values.data_ptr<bool>() + values.numel());
    } else {
      const torch::Tensor v = values.to(torch::kLong);
      out["data"] = std::vector<int64_t>(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + v.numel());
    }
    texts.push_back(out.dump());
  }
  nlohmann::json j{{"model_name", config.name}, {"model_version", std::to_string(version)}};
  if (!request.id.empty()) j["id"] = request.id;
  // "outputs" sorts last, where nlohmann would put it: the bytes are j's with the outputs in it.
  InferResponse response{with_raw_member(j, "outputs", "[" + c10::Join(",", texts) + "]"), "application/json",
                         std::nullopt};
  const bool any_binary = std::any_of(request.outputs.begin(), request.outputs.end(),
                                      [](const RequestedOutput& r) { return r.binary; });
  if (any_binary) {
    response.header_length = response.body.size();
    response.body += binary;
    response.content_type = "application/octet-stream";
  }
  return response;
}

nlohmann::json server_metadata() {
  return {{"name", "lockstep"},
          {"version", "0.1.0"},
          {"extensions", {"binary_tensor_data", "statistics", "model_configuration", "model_repository"}}};
}

std::string model_platform(const ModelConfig& config) {
  return config.format == ModelFormat::kTorchScript ? "pytorch_libtorch" : "lockstep_" + config.architecture;
}

nlohmann::json model_metadata(const ModelConfig& config, const std::vector<int64_t>& versions) {
  auto tensors = [&config](const std::vector<TensorSpec>& specs) {
    nlohmann::json list = nlohmann::json::array();
    for (const TensorSpec& t : specs)
      list.push_back({{"name", t.name}, {"datatype", t.datatype}, {"shape", request_shape(config, t, -1)}});
    return list;
  };
  std::vector<std::string> names;
  for (int64_t v : versions) names.push_back(std::to_string(v));
  return {{"name", config.name},
          {"versions", names},
          {"platform", model_platform(config)},
          {"inputs", tensors(config.inputs)},
          {"outputs", tensors(config.outputs)}};
}

nlohmann::json model_config_json(const ModelConfig& config) {
  auto tensors = [](const std::vector<TensorSpec>& specs) {
    nlohmann::json list = nlohmann::json::array();
    for (const TensorSpec& t : specs)
      list.push_back({{"name", t.name}, {"data_type", "TYPE_" + t.datatype}, {"dims", t.dims}});
    return list;
  };
  const VersionPolicy& v = config.version_policy;
  nlohmann::json policy;
  switch (v.kind) {
    case VersionPolicyKind::kLatest: policy = {{"latest", {{"num_versions", v.num_versions}}}}; break;
    case VersionPolicyKind::kAll: policy = {{"all", nlohmann::json::object()}}; break;
    case VersionPolicyKind::kSpecific: policy = {{"specific", {{"versions", v.versions}}}}; break;
  }
  nlohmann::json c{{"name", config.name}};
  if (config.format == ModelFormat::kTorchScript) {
    c["platform"] = "pytorch_libtorch";
    c["backend"] = "pytorch";
  } else {  // the reference model, so that the config loads again as a load's override
    c["backend"] = "lockstep";
    c["parameters"] = {{"architecture", {{"string_value", config.architecture}}}};
  }
  c["version_policy"] = policy;
  c["max_batch_size"] = config.max_batch_size;
  c["input"] = tensors(config.inputs);
  c["output"] = tensors(config.outputs);
  c["instance_group"] = {{{"name", config.name + "_0"}, {"kind", "KIND_CPU"}, {"count", config.instance_count}}};
  if (config.dynamic_batching) {
    const nlohmann::json queue{{"max_queue_size", config.max_queue_size},
                               {"default_timeout_microseconds", config.queue_timeout_us}};
    c["dynamic_batching"] = {{"preferred_batch_size", config.preferred_batch_sizes},
                             {"max_queue_delay_microseconds", config.max_queue_delay_us},
                             {"default_queue_policy", queue}};
  }
  return c;
}

std::string error_body(const std::string& message) {
  // A message may quote bytes of the request that are not UTF-8: replaced, never a throw.
  return nlohmann::json{{"error", message}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace lockstep::serve
