// A model's files in the repository: its config.pbtxt, its version directories and their weights,
// loaded into served versions (see model_files.h).
#include "model_files.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <algorithm>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/process.h"
#include "lockstep/export/weights_file.h"
#include "lockstep/infer/predictor.h"
#include "lockstep/models/torchscript_module.h"
#include "lockstep/models/zoo.h"
#include "torchscript_instance.h"

namespace lockstep::serve {
namespace fs = std::filesystem;
namespace {

constexpr const char* kConfigFile = "config.pbtxt";
constexpr const char* kWeightsFile = "model.pt";

// A version directory's number: a decimal name without a leading zero (Triton ignores the rest).
std::optional<int64_t> version_number(const std::string& name) {
  if (name.empty() || name.size() > 18 || name[0] == '0' ||
      !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(name);
}

// "INPUT__0 [1, 16] TYPE_FP32" for each of `specs`, as a request of one sample has them.
std::string shapes_text(const ModelConfig& config, const std::vector<TensorSpec>& specs) {
  std::vector<std::string> items;
  for (const TensorSpec& t : specs)
    items.push_back("'" + t.name + "' " + c10::str(c10::IntArrayRef(request_shape(config, t, 1))) + " TYPE_" + t.datatype);
  return c10::Join(", ", items);
}

// The module a version's instances share, loaded from `file` (see Note [Intra-op threads of
// instances]) and checked with one forward of a zero sample of each input as config.pbtxt declares it.
Batcher::Instance load_instance(const ModelConfig& config, const std::string& file) {
  Batcher::Instance instance;
  if (config.format == ModelFormat::kTorchScript) {
    instance = torchscript_instance(config, file);
  } else {
    auto model = models::make_model(config.architecture, config.outputs.at(0).dims.at(0));
    exporting::load_weights(*model, config.architecture, file);
    auto predictor = std::make_shared<infer::Predictor>(torch::nn::AnyModule(model));
    instance = Batcher::one_tensor([predictor](const torch::Tensor& input) { return predictor->forward(input); });
  }
  Tensors zeros;
  for (const TensorSpec& t : config.inputs)
    zeros.push_back(torch::zeros(request_shape(config, t, 1), torch::dtype(scalar_type(t.datatype))));
  Tensors out;
  try {
    out = instance(zeros);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "model '", config.name, "' ('", file, "') fails on zero inputs as config.pbtxt declares them (",
                shapes_text(config, config.inputs), "): ", models::script_error_message(e));
  }
  TORCH_CHECK(out.size() == config.outputs.size(), "model '", config.name, "' ('", file, "') returns ", out.size(),
              " output(s) where config.pbtxt declares ", config.outputs.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const std::vector<int64_t> expected = request_shape(config, config.outputs[i], 1);
    TORCH_CHECK(out[i].sizes() == c10::IntArrayRef(expected), "model '", config.name, "' ('", file, "') returns shape ",
                out[i].sizes(), " for output '", config.outputs[i].name, "' on one sample, not the ",
                c10::IntArrayRef(expected), " config.pbtxt declares (outputs ", shapes_text(config, config.outputs), ")");
  }
  return instance;
}

}  // namespace

ServedVersion load_version(const ModelConfig& config, int64_t version, const std::string& weights,
                           int64_t threads_per_instance) {
  ServedVersion v;
  v.version = version;
  v.statistics = std::make_unique<ModelStatistics>();
  // See Note [Intra-op threads of instances]: one module, loaded once, run by every instance.
  std::vector<Batcher::Instance> instances(static_cast<size_t>(config.instance_count), load_instance(config, weights));
  v.batcher = std::make_unique<Batcher>(std::move(instances),
                                        BatcherOptions()
                                            .max_batch_size(config.max_batch_size)
                                            .dynamic_batching(config.dynamic_batching)
                                            .preferred_batch_sizes(config.preferred_batch_sizes)
                                            .max_queue_delay_us(config.max_queue_delay_us)
                                            .max_queue_size(config.max_queue_size)
                                            .queue_timeout_us(config.queue_timeout_us)
                                            .threads_per_instance(threads_per_instance),
                                        *v.statistics);
  return v;
}

int64_t share_threads(int64_t threads, int64_t instances) {
  const int64_t total = threads > 0 ? threads : available_cores();
  return std::max<int64_t>(1, total / std::max<int64_t>(1, instances));
}

void load_versions(ServedModel& model, const fs::path& directory, int64_t threads_per_instance) {
  try {
    std::vector<int64_t> available;
    for (const auto& entry : fs::directory_iterator(directory))
      if (const auto v = version_number(entry.path().filename().string()); v && entry.is_directory())
        available.push_back(*v);
    const std::vector<int64_t> chosen = select_versions(model.config->version_policy, available);
    TORCH_CHECK(!chosen.empty(), "no version directory to serve in '", directory.string(),
                "' (expected e.g. 1/model.pt)");
    if (model.config->version_policy.kind == VersionPolicyKind::kSpecific)
      for (int64_t v : model.config->version_policy.versions)
        TORCH_CHECK(std::count(chosen.begin(), chosen.end(), v) == 1, "version_policy asks for version ", v,
                    " but '", (directory / std::to_string(v)).string(), "' does not exist");
    for (int64_t v : chosen) {
      try {
        model.versions.push_back(load_version(*model.config, v, (directory / std::to_string(v) / kWeightsFile).string(),
                                              threads_per_instance));
      } catch (const c10::Error& e) {
        model.unavailable.push_back({v, e.what_without_backtrace()});
      } catch (const std::exception& e) {
        model.unavailable.push_back({v, e.what()});
      }
    }
    if (model.versions.empty()) {
      std::vector<std::string> reasons;
      for (const UnavailableVersion& u : model.unavailable)
        reasons.push_back(chosen.size() == 1 ? u.reason : "version " + std::to_string(u.version) + ": " + u.reason);
      model.reason = c10::Join("; ", reasons);
      model.unavailable.clear();  // the model itself is unavailable: the reason says why, version by version
      return;
    }
    model.ready = true;
  } catch (const c10::Error& e) {
    model.versions.clear();
    model.reason = e.what_without_backtrace();
  } catch (const std::exception& e) {
    model.versions.clear();
    model.reason = e.what();
  }
}

std::string fingerprint(const fs::path& directory) {
  std::vector<std::string> parts;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(directory, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it.depth() > 1) {
      it.disable_recursion_pending();
      continue;
    }
    std::error_code e;
    const auto size = it->is_regular_file(e) ? it->file_size(e) : 0;
    const auto time = it->last_write_time(e).time_since_epoch().count();
    parts.push_back(fs::relative(it->path(), directory, e).string() + " " + std::to_string(size) + " " +
                    std::to_string(time));
  }
  std::sort(parts.begin(), parts.end());
  return c10::Join("\n", parts);
}

std::vector<std::string> model_directories(const std::string& directory) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory))
    if (entry.is_directory()) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

ModelConfig read_config(const fs::path& dir) {
  const fs::path config_path = dir / kConfigFile;
  TORCH_CHECK_VALUE(fs::exists(config_path), "'", config_path.string(), "' does not exist");
  const std::vector<char> bytes = read_file(config_path.string());
  return parse_model_config(std::string(bytes.begin(), bytes.end()), config_path.string(),
                            dir.filename().string());
}

}  // namespace lockstep::serve
