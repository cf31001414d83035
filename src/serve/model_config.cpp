#include "lockstep/serve/model_config.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "lockstep/models/zoo.h"
#include "model_config.pb.h"

namespace lockstep::serve {
namespace {

constexpr int64_t kDefaultNumClasses = 10;

// Collects the text-format parser's complaints as "source:line:column: message" (1-based; the
// parser counts from 0).
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  explicit ErrorCollector(std::string source) : source_(std::move(source)) {}
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (first_.empty()) first_ = source_ + ":" + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  void AddWarning(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
  const std::string& first() const { return first_; }

 private:
  std::string source_;
  std::string first_;
};

std::string kserve_datatype(proto::DataType type) {
  std::string name = proto::DataType_Name(type);  // TYPE_FP32
  name = name.substr(5);
  return name == "STRING" ? "BYTES" : name;
}

std::string dims_text(const std::vector<int64_t>& dims) { return "[" + c10::Join(", ", dims) + "]"; }

// The served datatypes' dtypes, in served_datatypes()'s order.
const std::vector<c10::ScalarType>& served_scalar_types() {
  static const std::vector<c10::ScalarType> types{c10::kFloat, c10::kHalf, c10::kBFloat16,
                                                  c10::kLong,  c10::kInt,  c10::kBool};
  return types;
}

// `what` is "input" or "output"; a reference model's tensors are FP32 (`fp32_only`).
TensorSpec tensor_spec(const proto::Tensor& t, const char* what, const std::string& source, bool fp32_only) {
  TORCH_CHECK_VALUE(!t.name().empty(), source, ": an ", what, " has no name");
  const std::string datatype = kserve_datatype(t.data_type());
  const auto& served = served_datatypes();
  if (fp32_only)
    TORCH_CHECK_VALUE(datatype == "FP32", source, ": ", what, " '", t.name(), "' has data_type ",
                      proto::DataType_Name(t.data_type()), "; lockstep's reference models take and return TYPE_FP32");
  TORCH_CHECK_VALUE(std::count(served.begin(), served.end(), datatype) == 1, source, ": ", what, " '", t.name(),
                    "' has data_type ", proto::DataType_Name(t.data_type()), "; lockstep serves TYPE_",
                    c10::Join(", TYPE_", served));
  return {t.name(), datatype, {t.dims().begin(), t.dims().end()}};
}

// A TorchScript model's inputs or outputs: at least one, distinct names, sizes of at least 1.
std::vector<TensorSpec> tensor_specs(const google::protobuf::RepeatedPtrField<proto::Tensor>& list, const char* what,
                                     const std::string& source) {
  TORCH_CHECK_VALUE(!list.empty(), source, ": no ", what, "; list the module's ", what,
                    "s, e.g. ", what, " [ { name: \"", what == std::string("input") ? "INPUT__0" : "OUTPUT__0",
                    "\" data_type: TYPE_FP32 dims: [ 16 ] } ]");
  std::vector<TensorSpec> specs;
  for (const proto::Tensor& t : list) {
    specs.push_back(tensor_spec(t, what, source, /*fp32_only=*/false));
    const TensorSpec& spec = specs.back();
    for (size_t i = 0; i + 1 < specs.size(); ++i)
      TORCH_CHECK_VALUE(specs[i].name != spec.name, source, ": two ", what, "s are named '", spec.name, "'");
    TORCH_CHECK_VALUE(!spec.dims.empty() && std::all_of(spec.dims.begin(), spec.dims.end(), [](int64_t d) { return d >= 1; }),
                      source, ": ", what, " '", spec.name, "' dims ", dims_text(spec.dims),
                      " must be sizes of at least 1 (variable sizes, -1, are not served)");
  }
  return specs;
}

// dynamic_batching, instance_group and version_policy, the same for every format.
void read_scheduling(const proto::ModelConfig& p, ModelConfig& c, const std::string& source) {
  c.dynamic_batching = p.has_dynamic_batching();
  const proto::DynamicBatching& d = p.dynamic_batching();
  for (int64_t size : d.preferred_batch_size()) {
    TORCH_CHECK_VALUE(size >= 1 && size <= c.max_batch_size, source, ": preferred_batch_size ", size,
                      " must be between 1 and max_batch_size ", c.max_batch_size);
    c.preferred_batch_sizes.push_back(size);
  }
  std::sort(c.preferred_batch_sizes.begin(), c.preferred_batch_sizes.end());
  c.max_queue_delay_us = static_cast<int64_t>(d.max_queue_delay_microseconds());
  c.max_queue_size = d.default_queue_policy().max_queue_size();
  c.queue_timeout_us = static_cast<int64_t>(d.default_queue_policy().default_timeout_microseconds());

  c.instance_count = p.instance_group_size() == 0 ? 1 : 0;
  for (const auto& group : p.instance_group()) {
    TORCH_CHECK_VALUE(group.kind() != proto::InstanceGroup::KIND_GPU, source,
                      ": instance_group kind KIND_GPU: this server runs on the CPU; use KIND_CPU");
    TORCH_CHECK_VALUE(group.count() >= 0, source, ": instance_group count ", group.count(), " must not be negative");
    c.instance_count += group.count() == 0 ? 1 : group.count();  // Triton's default count is 1
    TORCH_CHECK_VALUE(c.instance_count <= kMaxInstances, source, ": instance_group count ", group.count(), " makes ",
                      c.instance_count, " instances; a model has at most ", kMaxInstances,
                      " (each is a copy of the weights and a thread, and they share the server's intra-op threads)");
  }

  const proto::VersionPolicy& v = p.version_policy();
  if (v.has_all()) {
    c.version_policy.kind = VersionPolicyKind::kAll;
  } else if (v.has_specific()) {
    c.version_policy.kind = VersionPolicyKind::kSpecific;
    c.version_policy.versions.assign(v.specific().versions().begin(), v.specific().versions().end());
    TORCH_CHECK_VALUE(!c.version_policy.versions.empty(), source, ": version_policy specific lists no versions");
  } else if (v.has_latest()) {
    TORCH_CHECK_VALUE(v.latest().num_versions() >= 1, source, ": version_policy latest num_versions ",
                      v.latest().num_versions(), " must be at least 1");
    c.version_policy.num_versions = v.latest().num_versions();
  }
}

// Triton's PyTorch backend's parameters (its switches for the JIT and for GPUs); lockstep accepts
// them so that a repository serves unchanged, and always runs the module in inference mode.
const std::set<std::string> kPyTorchBackendParameters{
    "DISABLE_OPTIMIZED_EXECUTION", "INFERENCE_MODE", "DISABLE_CUDNN", "ENABLE_WEIGHT_SHARING",
    "ENABLE_CACHE_CLEANING", "ENABLE_JIT_EXECUTOR", "ENABLE_JIT_PROFILING", "ENABLE_NVFUSER",
    "ENABLE_TENSOR_FUSER", "INTRA_OP_THREAD_COUNT", "INTER_OP_THREAD_COUNT"};

// Triton's PyTorch backend: the module's own inputs and outputs, as the config names and types
// them; which forward argument and which returned tensor each is, is settled against the module
// when it loads (Note [TorchScript inputs and outputs]). max_batch_size 0: no batch dimension.
ModelConfig torchscript_config(const proto::ModelConfig& p, ModelConfig c, const std::string& source) {
  c.format = ModelFormat::kTorchScript;
  for (const auto& item : p.parameters())
    TORCH_CHECK_VALUE(kPyTorchBackendParameters.count(item.first) == 1, source, ": unknown parameter '", item.first,
                      "' for the PyTorch backend; lockstep accepts ", c10::Join(", ", kPyTorchBackendParameters));
  TORCH_CHECK_VALUE(p.max_batch_size() >= 0, source, ": max_batch_size ", p.max_batch_size(),
                    " must be at least 0 (0: the model has no batch dimension)");
  c.max_batch_size = p.max_batch_size();
  c.inputs = tensor_specs(p.input(), "input", source);
  c.outputs = tensor_specs(p.output(), "output", source);
  read_scheduling(p, c, source);
  return c;
}

// The checks every config passes, however it was written (config.pbtxt, or a load's JSON override).
ModelConfig config_of(const proto::ModelConfig& p, const std::string& source, const std::string& directory_name) {
  ModelConfig c;
  c.name = p.name().empty() ? directory_name : p.name();
  TORCH_CHECK_VALUE(c.name == directory_name, source, ": name '", p.name(), "' differs from its directory '",
                    directory_name, "'; a model's name is its directory's name");
  const std::string backend = !p.backend().empty() ? p.backend() : p.platform();
  if (backend == "pytorch" || backend == "pytorch_libtorch") return torchscript_config(p, std::move(c), source);
  TORCH_CHECK_VALUE(backend == "lockstep", source, ": ", p.backend().empty() ? "platform" : "backend", " '", backend,
                    "' is not served here; set backend: \"lockstep\" (the weights of a lockstep reference model) or ",
                    "platform: \"pytorch_libtorch\" (a TorchScript model.pt, as Triton's PyTorch backend)");
  const auto architecture = p.parameters().find("architecture");
  c.architecture = architecture != p.parameters().end() ? architecture->second.string_value() : c.name;
  for (const auto& item : p.parameters())
    TORCH_CHECK_VALUE(item.first == "architecture", source, ": unknown parameter '", item.first,
                      "'; the one parameter is \"architecture\"");
  TORCH_CHECK_VALUE(std::count(models::model_names().begin(), models::model_names().end(), c.architecture) == 1,
                    source, ": '", c.architecture, "' is not a reference model (", c10::Join(", ", models::model_names()),
                    "); name the model after one, or add parameters { key: \"architecture\" value: { string_value: \"convnet\" } }");

  TORCH_CHECK_VALUE(p.max_batch_size() >= 1, source, ": max_batch_size ", p.max_batch_size(),
                    " must be at least 1 (the reference models take a batch dimension)");
  c.max_batch_size = p.max_batch_size();
  TORCH_CHECK_VALUE(p.input_size() == 1 && p.output_size() == 1, source, ": ", p.input_size(), " input(s) and ",
                    p.output_size(), " output(s); a reference model has exactly one of each");
  const TensorSpec& input = c.inputs.at(0) = tensor_spec(p.input(0), "input", source, /*fp32_only=*/true);
  const TensorSpec& output = c.outputs.at(0) = tensor_spec(p.output(0), "output", source, /*fp32_only=*/true);
  const std::vector<int64_t> shape = models::input_shape(c.architecture);
  TORCH_CHECK_VALUE(input.dims == shape, source, ": input '", input.name, "' dims ", dims_text(input.dims),
                    " do not fit a ", c.architecture, ", which takes ", dims_text(shape), " per sample");
  TORCH_CHECK_VALUE(output.dims.size() == 1 && output.dims[0] >= 2, source, ": output '", output.name,
                    "' dims ", dims_text(output.dims), " must be [classes], e.g. [10]");
  read_scheduling(p, c, source);
  return c;
}

}  // namespace

const std::vector<std::string>& served_datatypes() {
  static const std::vector<std::string> names{"FP32", "FP16", "BF16", "INT64", "INT32", "BOOL"};
  return names;
}

c10::ScalarType scalar_type(const std::string& datatype) {
  const auto& names = served_datatypes();
  const auto at = std::find(names.begin(), names.end(), datatype);
  TORCH_CHECK_VALUE(at != names.end(), "datatype '", datatype, "' is not served; choose ", c10::Join(", ", names));
  return served_scalar_types()[static_cast<size_t>(at - names.begin())];
}

std::vector<int64_t> request_shape(const ModelConfig& config, const TensorSpec& spec, int64_t samples) {
  if (config.max_batch_size == 0) return spec.dims;
  std::vector<int64_t> shape{samples};
  shape.insert(shape.end(), spec.dims.begin(), spec.dims.end());
  return shape;
}

ModelConfig default_model_config(const std::string& architecture, int64_t instance_count) {
  models::check_model_name(architecture);
  TORCH_CHECK_VALUE(instance_count >= 1 && instance_count <= kMaxInstances, "instance_count ", instance_count,
                    ": a model has between 1 and ", kMaxInstances, " instances");
  ModelConfig c;
  c.name = architecture;
  c.architecture = architecture;
  c.inputs.at(0).dims = models::input_shape(architecture);
  c.outputs.at(0).dims = {kDefaultNumClasses};
  c.instance_count = instance_count;
  return c;
}

ModelConfig parse_model_config(const std::string& text, const std::string& source, const std::string& directory_name) {
  proto::ModelConfig p;
  ErrorCollector errors(source);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  TORCH_CHECK_VALUE(parser.ParseFromString(text, &p), errors.first().empty() ? source + ": cannot parse" : errors.first());
  return config_of(p, source, directory_name);
}

ModelConfig parse_model_config_json(const std::string& json, const std::string& source,
                                    const std::string& directory_name) {
  proto::ModelConfig p;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &p);  // unknown fields refused
  if (!status.ok()) {
    // A syntax error's message is three lines: what, the text around it, and a caret under it.
    const std::string message(status.message());
    const size_t end = message.find('\n'), next = end == std::string::npos ? end : message.find('\n', end + 1);
    TORCH_CHECK_VALUE(false, source, ": ", message.substr(0, end),
                      end == std::string::npos ? "" : " near '" + message.substr(end + 1, next - end - 1) + "'",
                      " (a model configuration in JSON, as Triton's config endpoint returns it)");
  }
  return config_of(p, source, directory_name);
}

std::vector<int64_t> select_versions(const VersionPolicy& policy, std::vector<int64_t> available) {
  std::sort(available.begin(), available.end());
  switch (policy.kind) {
    case VersionPolicyKind::kAll:
      return available;
    case VersionPolicyKind::kSpecific: {
      std::vector<int64_t> chosen;
      for (int64_t v : available)
        if (std::count(policy.versions.begin(), policy.versions.end(), v) > 0) chosen.push_back(v);
      return chosen;
    }
    case VersionPolicyKind::kLatest:
      break;
  }
  const auto keep = std::min<size_t>(available.size(), static_cast<size_t>(policy.num_versions));
  return {available.end() - static_cast<std::ptrdiff_t>(keep), available.end()};
}

}  // namespace lockstep::serve
