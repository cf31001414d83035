#include "lockstep/serve/model_config.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

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

TensorSpec tensor_spec(const proto::Tensor& t, const char* field, const std::string& source) {
  TORCH_CHECK_VALUE(!t.name().empty(), source, ": an ", field, " has no name");
  TORCH_CHECK_VALUE(t.data_type() == proto::TYPE_FP32, source, ": ", field, " '", t.name(), "' has data_type ",
                    proto::DataType_Name(t.data_type()), "; lockstep serves TYPE_FP32 inputs and outputs");
  return {t.name(), kserve_datatype(t.data_type()), {t.dims().begin(), t.dims().end()}};
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

// Triton's PyTorch backend: the module's own inputs and outputs, named in the config (INPUT__0,
// OUTPUT__0 by Triton's convention). So far one FP32 input and one FP32 output with a batch
// dimension (issue 30 adds several, other types and max_batch_size 0).
ModelConfig torchscript_config(const proto::ModelConfig& p, ModelConfig c, const std::string& source) {
  c.format = ModelFormat::kTorchScript;
  for (const auto& item : p.parameters())
    TORCH_CHECK_VALUE(kPyTorchBackendParameters.count(item.first) == 1, source, ": unknown parameter '", item.first,
                      "' for the PyTorch backend; lockstep accepts ", c10::Join(", ", kPyTorchBackendParameters));
  TORCH_CHECK_VALUE(p.max_batch_size() >= 1, source, ": max_batch_size ", p.max_batch_size(),
                    " must be at least 1 (a model without a batch dimension is not served yet)");
  c.max_batch_size = p.max_batch_size();
  TORCH_CHECK_VALUE(p.input_size() == 1 && p.output_size() == 1, source, ": ", p.input_size(), " input(s) and ",
                    p.output_size(), " output(s); a TorchScript model is served with one of each so far");
  c.input = tensor_spec(p.input(0), "input", source);
  c.output = tensor_spec(p.output(0), "output", source);
  for (const TensorSpec* t : {&c.input, &c.output})
    TORCH_CHECK_VALUE(!t->dims.empty() && std::all_of(t->dims.begin(), t->dims.end(), [](int64_t d) { return d >= 1; }),
                      source, ": '", t->name, "' dims ", dims_text(t->dims), " must be sizes of at least 1");
  read_scheduling(p, c, source);
  return c;
}

}  // namespace

ModelConfig default_model_config(const std::string& architecture, int64_t instance_count) {
  models::check_model_name(architecture);
  TORCH_CHECK_VALUE(instance_count >= 1 && instance_count <= kMaxInstances, "--instances ", instance_count,
                    " must be between 1 and ", kMaxInstances);
  ModelConfig c;
  c.name = architecture;
  c.architecture = architecture;
  c.input.dims = models::input_shape(architecture);
  c.output.dims = {kDefaultNumClasses};
  c.instance_count = instance_count;
  return c;
}

ModelConfig parse_model_config(const std::string& text, const std::string& source, const std::string& directory_name) {
  proto::ModelConfig p;
  ErrorCollector errors(source);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  TORCH_CHECK_VALUE(parser.ParseFromString(text, &p), errors.first().empty() ? source + ": cannot parse" : errors.first());

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
  c.input = tensor_spec(p.input(0), "input", source);
  c.output = tensor_spec(p.output(0), "output", source);
  const std::vector<int64_t> shape = models::input_shape(c.architecture);
  TORCH_CHECK_VALUE(c.input.dims == shape, source, ": input '", c.input.name, "' dims ", dims_text(c.input.dims),
                    " do not fit a ", c.architecture, ", which takes ", dims_text(shape), " per sample");
  TORCH_CHECK_VALUE(c.output.dims.size() == 1 && c.output.dims[0] >= 2, source, ": output '", c.output.name,
                    "' dims ", dims_text(c.output.dims), " must be [classes], e.g. [10]");
  read_scheduling(p, c, source);
  return c;
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
