#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::serve {

// One input or output of a served model, as the KServe v2 protocol names it.
struct TensorSpec {
  std::string name;
  std::string datatype = "FP32";  // KServe spelling: "FP32", "INT64", ... (one of served_datatypes())
  std::vector<int64_t> dims;      // without the batch dimension when max_batch_size > 0
};

// The datatypes a served tensor may have, in KServe's spelling: FP32, FP16, BF16, INT64, INT32,
// BOOL (config.pbtxt's TYPE_FP32, ...). The reference models take and return FP32 only.
const std::vector<std::string>& served_datatypes();
// The torch dtype of a served datatype ("INT64" -> kLong); throws c10::ValueError for another.
c10::ScalarType scalar_type(const std::string& datatype);

enum class VersionPolicyKind { kLatest, kAll, kSpecific };

// Which of the numbered version directories are served (Triton's version_policy).
struct VersionPolicy {
  VersionPolicyKind kind = VersionPolicyKind::kLatest;
  int64_t num_versions = 1;       // kLatest: the highest this many
  std::vector<int64_t> versions;  // kSpecific: exactly these
};

// What a version's model.pt holds: a lockstep reference model's weights (backend "lockstep"), or a
// TorchScript module (Triton's PyTorch backend: platform "pytorch_libtorch" or backend "pytorch").
enum class ModelFormat { kReference, kTorchScript };

// A served model's settings: what config.pbtxt says, validated, or the `--model` shortcut's
// defaults. See docs/serving.md for the accepted subset of config.pbtxt.
struct ModelConfig {
  std::string name;
  ModelFormat format = ModelFormat::kReference;
  std::string architecture;  // kReference: the model the weights are for (convnet, mlp, resnet18)
  // Samples per forward, at least 1; 0 (TorchScript only): the model has no batch dimension, dims
  // are whole shapes and every request runs alone, as Triton allows.
  int64_t max_batch_size = 64;
  std::vector<TensorSpec> inputs{{"input", "FP32", {}}};    // kReference: exactly one
  std::vector<TensorSpec> outputs{{"logits", "FP32", {}}};  // kReference: exactly one
  bool dynamic_batching = true;  // false: every request is its own forward
  std::vector<int64_t> preferred_batch_sizes;
  int64_t max_queue_delay_us = 0;
  int64_t max_queue_size = 0;     // queued requests; 0: unbounded
  int64_t queue_timeout_us = 0;   // 0: a request waits in the queue as long as it takes
  int64_t instance_count = 1;     // model copies running batches in parallel
  VersionPolicy version_policy;
};

// Instances of one model at most. Each is a thread of its own, started before the server listens
// (they share one copy of the weights): a count of 10^6 grew memory by ~110 MB/s and never opened
// the port.
constexpr int64_t kMaxInstances = 64;

// The `lockstep serve --model NAME` configuration: reference model `architecture` named after
// itself, tensors `input` and `logits`, dynamic batching up to 64 without queue delay.
ModelConfig default_model_config(const std::string& architecture, int64_t instance_count = 1);

// Parses config.pbtxt text (protobuf text format) for the model in directory `directory_name`.
// Throws c10::ValueError naming `source`, and the line and column for a syntax error or an unknown
// field; or naming the field and value that does not fit the reference model. A TorchScript model's
// inputs and outputs are checked against its module when it loads (serve/model_repository.h).
ModelConfig parse_model_config(const std::string& text, const std::string& source, const std::string& directory_name);
// The same configuration in protobuf's JSON mapping, as Triton's config endpoint returns it and a
// load request's "config" override carries it (field names as in config.pbtxt, or lowerCamelCase).
ModelConfig parse_model_config_json(const std::string& json, const std::string& source,
                                    const std::string& directory_name);

// The shape a tensor of `spec` has in a request of `samples` samples: (samples, dims...), or dims
// alone with max_batch_size 0; -1 for `samples` gives the shape metadata shows.
std::vector<int64_t> request_shape(const ModelConfig& config, const TensorSpec& spec, int64_t samples);

// The versions among `available` that `policy` serves, ascending.
std::vector<int64_t> select_versions(const VersionPolicy& policy, std::vector<int64_t> available);

}  // namespace lockstep::serve
