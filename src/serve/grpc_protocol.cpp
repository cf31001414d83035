#include "grpc_protocol.h"

#include <torch/torch.h>

#include <algorithm>

#include "infer_checks.h"

namespace lockstep::serve {
namespace {

// As HTTP refuses parameters it does not read: a result computed without "classification" or
// "shared_memory_region" must not pass for one with them.
template <typename Map>
void refuse_parameters(const Map& parameters, const std::string& what) {
  if (parameters.empty()) return;
  std::vector<std::string> keys;
  for (const auto& [key, value] : parameters) keys.push_back("'" + key + "'");
  std::sort(keys.begin(), keys.end());
  bad_request(what + " parameter(s) " + c10::Join(", ", keys) + " are not supported by this server (it reads none)");
}

// An input's parameters: `binary_data_size`, which KServe's gRPC client sets beside each input's
// raw_input_contents (the HTTP binary extension's name, where it is needed to cut the body), is
// read as a check on those bytes; any other is refused as above.
void check_input_parameters(const inference::ModelInferRequest::InferInputTensor& input, const std::string& what,
                            const std::string* raw) {
  auto parameters = input.parameters();
  const auto size = parameters.find("binary_data_size");
  if (size != parameters.end()) {
    const inference::InferParameter& p = size->second;
    const bool integer = p.has_int64_param() || p.has_uint64_param();
    const uint64_t value = p.has_int64_param() ? static_cast<uint64_t>(p.int64_param()) : p.uint64_param();
    if (raw == nullptr)
      bad_request(what + " has parameter 'binary_data_size' but the request has no raw_input_contents; send its " +
                  "bytes there or drop the parameter");
    if (!integer || (p.has_int64_param() && p.int64_param() < 0) || value != raw->size())
      bad_request(what + " has parameter 'binary_data_size' " + size->second.ShortDebugString() +
                  " but its raw_input_contents hold " + std::to_string(raw->size()) +
                  " bytes; give the bytes' count as an integer, or no such parameter");
    parameters.erase(size);
  }
  refuse_parameters(parameters, what);
}

// `values` (a repeated field of the contents) as a tensor of `spec`'s datatype and `shape`.
template <typename Repeated>
torch::Tensor tensor_of(const Repeated& values, c10::ScalarType stored, const TensorSpec& spec,
                        const std::vector<int64_t>& shape, const char* field) {
  const int64_t elements = c10::multiply_integers(shape);
  if (values.size() != elements)
    bad_request("input '" + spec.name + "' has " + std::to_string(values.size()) + " values in contents." + field +
                "; shape " + shape_text(shape) + " needs " + std::to_string(elements));
  using T = std::remove_cv_t<std::remove_reference_t<decltype(*values.begin())>>;
  torch::Tensor t = torch::empty(shape, stored);
  std::copy(values.begin(), values.end(), t.data_ptr<T>());
  return t;
}

// Input `spec`'s values from its typed contents field.
torch::Tensor contents_input(const inference::InferTensorContents& c, const TensorSpec& spec,
                             const std::vector<int64_t>& shape) {
  const c10::ScalarType type = scalar_type(spec.datatype);
  if (type == torch::kFloat) return tensor_of(c.fp32_contents(), torch::kFloat, spec, shape, "fp32_contents");
  if (type == torch::kLong) return tensor_of(c.int64_contents(), torch::kLong, spec, shape, "int64_contents");
  if (type == torch::kInt) return tensor_of(c.int_contents(), torch::kInt, spec, shape, "int_contents");
  if (type == torch::kBool) return tensor_of(c.bool_contents(), torch::kBool, spec, shape, "bool_contents");
  bad_request("input '" + spec.name + "' is " + spec.datatype + ", which has no contents field in the protocol; send " +
              "its little-endian bytes in raw_input_contents");
}

// Which of the config's outputs the response holds, in order.
std::vector<RequestedOutput> requested_outputs(const inference::ModelInferRequest& m, const ModelConfig& config) {
  std::vector<RequestedOutput> out;
  if (m.outputs().empty()) {
    for (size_t i = 0; i < config.outputs.size(); ++i) out.push_back({i, true});
    return out;
  }
  for (const auto& output : m.outputs()) {
    const auto spec = std::find_if(config.outputs.begin(), config.outputs.end(),
                                   [&](const TensorSpec& t) { return output.name() == t.name; });
    if (spec == config.outputs.end())
      bad_request("unknown output '" + output.name() + "'; model '" + config.name + "' returns " +
                  names_text(config.outputs));
    const size_t index = static_cast<size_t>(spec - config.outputs.begin());
    for (const RequestedOutput& r : out)
      if (r.index == index) bad_request("output '" + spec->name + "' is asked for twice");
    refuse_parameters(output.parameters(), "output '" + spec->name + "'");
    out.push_back({index, true});
  }
  return out;
}

inference::DataType config_datatype(const std::string& datatype) {
  inference::DataType type = inference::TYPE_INVALID;
  inference::DataType_Parse("TYPE_" + datatype, &type);
  return type;
}

void write_duration(const Duration& d, inference::StatisticDuration& out) {
  out.set_count(static_cast<uint64_t>(d.count));
  out.set_ns(static_cast<uint64_t>(d.ns));
}

}  // namespace

InferRequest parse_grpc_infer_request(const inference::ModelInferRequest& m, const ModelConfig& config) {
  InferRequest request;
  request.id = m.id();
  // Triton's clients (perf_analyzer's among them) set triton_enable_empty_final_response on every
  // call: it asks a decoupled model's stream for a last empty response, which a unary call to a
  // model that answers once never has, so it changes nothing here, as in Triton.
  auto parameters = m.parameters();
  const auto empty_final = parameters.find("triton_enable_empty_final_response");
  if (empty_final != parameters.end()) {
    if (!empty_final->second.has_bool_param())
      bad_request("the request's parameter 'triton_enable_empty_final_response' is a bool_param, got " +
                  empty_final->second.ShortDebugString());
    parameters.erase(empty_final);
  }
  refuse_parameters(parameters, "the request's");
  if (m.inputs().empty())
    bad_request("the request has no inputs; model '" + config.name + "' takes " + names_text(config.inputs));
  if (static_cast<size_t>(m.inputs_size()) > config.inputs.size())
    bad_request("the request has " + std::to_string(m.inputs_size()) + " inputs; model '" + config.name + "' takes " +
                std::to_string(config.inputs.size()) + " (" + names_text(config.inputs) + "), each named once");
  const bool raw = !m.raw_input_contents().empty();
  if (raw && m.raw_input_contents_size() != m.inputs_size())
    bad_request("the request has " + std::to_string(m.inputs_size()) + " inputs but " +
                std::to_string(m.raw_input_contents_size()) +
                " raw_input_contents; give every input's bytes there, in the inputs' order, or none");
  request.inputs.resize(config.inputs.size());
  for (int i = 0; i < m.inputs_size(); ++i) {
    const auto& input = m.inputs(i);
    const auto spec = std::find_if(config.inputs.begin(), config.inputs.end(),
                                   [&](const TensorSpec& t) { return input.name() == t.name; });
    if (spec == config.inputs.end())
      bad_request("unknown input '" + input.name() + "'; model '" + config.name + "' takes " +
                  names_text(config.inputs));
    torch::Tensor& tensor = request.inputs[static_cast<size_t>(spec - config.inputs.begin())];
    if (tensor.defined()) bad_request("input '" + spec->name + "' is given twice");
    if (input.datatype() != spec->datatype)
      bad_request("input '" + spec->name + "' has datatype \"" + input.datatype() + "\"; model '" + config.name +
                  "' takes " + spec->datatype);
    const std::vector<int64_t> shape(input.shape().begin(), input.shape().end());
    check_input_shape(shape, *spec, config);
    check_input_parameters(input, "input '" + spec->name + "'", raw ? &m.raw_input_contents(i) : nullptr);
    if (raw && input.has_contents())  // as Triton refuses them
      bad_request("input '" + spec->name +
                  "' has both contents and raw_input_contents; give its values in one of them");
    if (raw) {
      const std::string& bytes = m.raw_input_contents(i);
      tensor = tensor_from_bytes(bytes.data(), bytes.size(), *spec, shape,
                                 "raw_input_contents[" + std::to_string(i) + "]'s " + std::to_string(bytes.size()) +
                                     " bytes");
    } else {
      tensor = contents_input(input.contents(), *spec, shape);
    }
  }
  check_complete(request.inputs, config);
  request.outputs = requested_outputs(m, config);
  return request;
}

void write_grpc_infer_response(const InferRequest& request, const ModelConfig& config, int64_t version,
                               const Tensors& outputs, inference::ModelInferResponse& response) {
  response.set_model_name(config.name);
  response.set_model_version(std::to_string(version));
  response.set_id(request.id);
  for (const RequestedOutput& r : request.outputs) {
    const TensorSpec& spec = config.outputs.at(r.index);
    const torch::Tensor values = outputs.at(r.index).to(scalar_type(spec.datatype)).contiguous();
    auto* out = response.add_outputs();
    out->set_name(spec.name);
    out->set_datatype(spec.datatype);
    for (int64_t d : values.sizes()) out->add_shape(d);
    response.add_raw_output_contents(static_cast<const char*>(values.data_ptr()), static_cast<size_t>(values.nbytes()));
  }
}

void write_model_metadata(const ModelConfig& config, const std::vector<int64_t>& versions,
                          inference::ModelMetadataResponse& response) {
  response.set_name(config.name);
  for (int64_t v : versions) response.add_versions(std::to_string(v));
  response.set_platform(model_platform(config));
  auto add = [&config](const std::vector<TensorSpec>& specs, auto* list) {
    for (const TensorSpec& t : specs) {
      auto* m = list->Add();
      m->set_name(t.name);
      m->set_datatype(t.datatype);
      for (int64_t d : request_shape(config, t, -1)) m->add_shape(d);
    }
  };
  add(config.inputs, response.mutable_inputs());
  add(config.outputs, response.mutable_outputs());
}

void write_model_config(const ModelConfig& config, inference::ModelConfig& out) {
  out.set_name(config.name);
  if (config.format == ModelFormat::kTorchScript) {
    out.set_platform("pytorch_libtorch");
    out.set_backend("pytorch");
  } else {
    out.set_backend("lockstep");
    (*out.mutable_parameters())["architecture"].set_string_value(config.architecture);
  }
  const VersionPolicy& v = config.version_policy;
  switch (v.kind) {
    case VersionPolicyKind::kLatest:
      out.mutable_version_policy()->mutable_latest()->set_num_versions(static_cast<uint32_t>(v.num_versions));
      break;
    case VersionPolicyKind::kAll: out.mutable_version_policy()->mutable_all(); break;
    case VersionPolicyKind::kSpecific:
      for (int64_t n : v.versions) out.mutable_version_policy()->mutable_specific()->add_versions(n);
      break;
  }
  out.set_max_batch_size(static_cast<int32_t>(config.max_batch_size));
  for (const TensorSpec& t : config.inputs) {
    auto* m = out.add_input();
    m->set_name(t.name);
    m->set_data_type(config_datatype(t.datatype));
    for (int64_t d : t.dims) m->add_dims(d);
  }
  for (const TensorSpec& t : config.outputs) {
    auto* m = out.add_output();
    m->set_name(t.name);
    m->set_data_type(config_datatype(t.datatype));
    for (int64_t d : t.dims) m->add_dims(d);
  }
  auto* group = out.add_instance_group();
  group->set_name(config.name + "_0");
  group->set_kind(inference::ModelInstanceGroup::KIND_CPU);
  group->set_count(static_cast<int32_t>(config.instance_count));
  if (config.dynamic_batching) {
    auto* d = out.mutable_dynamic_batching();
    for (int64_t b : config.preferred_batch_sizes) d->add_preferred_batch_size(static_cast<int32_t>(b));
    d->set_max_queue_delay_microseconds(static_cast<uint64_t>(config.max_queue_delay_us));
    d->mutable_default_queue_policy()->set_max_queue_size(static_cast<uint32_t>(config.max_queue_size));
    d->mutable_default_queue_policy()->set_default_timeout_microseconds(static_cast<uint64_t>(config.queue_timeout_us));
  }
}

void write_statistics(const std::string& model, const std::string& version, const ModelStatistics::Snapshot& s,
                      inference::ModelStatistics& out) {
  out.set_name(model);
  out.set_version(version);
  out.set_last_inference(static_cast<uint64_t>(s.last_inference_ms));
  out.set_inference_count(static_cast<uint64_t>(s.inference_count));
  out.set_execution_count(static_cast<uint64_t>(s.execution_count));
  auto* i = out.mutable_inference_stats();
  write_duration(s.success, *i->mutable_success());
  write_duration(s.fail, *i->mutable_fail());
  write_duration(s.queue, *i->mutable_queue());
  write_duration(s.compute_input, *i->mutable_compute_input());
  write_duration(s.compute_infer, *i->mutable_compute_infer());
  write_duration(s.compute_output, *i->mutable_compute_output());
  for (const auto& [size, b] : s.batch_stats) {
    auto* batch = out.add_batch_stats();
    batch->set_batch_size(static_cast<uint64_t>(size));
    write_duration(b.compute_input, *batch->mutable_compute_input());
    write_duration(b.compute_infer, *batch->mutable_compute_infer());
    write_duration(b.compute_output, *batch->mutable_compute_output());
  }
}

}  // namespace lockstep::serve
