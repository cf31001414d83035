// See Note [accelerate configs].
#include "lockstep/launch/accelerate_config.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "lockstep/launch/rendezvous.h"
#include "../core/yaml_error.h"

namespace lockstep::launch {
namespace {

// A host name is at most 253 bytes (RFC 1035); other values are names, numbers and paths, and a
// path is at most PATH_MAX (4096) bytes. Longer values are refused by their length, never echoed.
constexpr size_t kMaxHostNameBytes = 253;
constexpr size_t kMaxValueBytes = 4096;

// Keys with no meaning for a CPU launch by `lockstep run` (devices, TPUs, the Python entry point,
// accelerate's own port checks): accepted whatever their value.
const std::set<std::string> kInert{"use_cpu",  "gpu_ids",      "main_training_function", "same_network",
                                   "tpu_env",  "tpu_use_cluster", "tpu_use_sudo",        "tpu_name",
                                   "tpu_zone", "command_file", "commands",               "tpu_vm"};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// Null, empty, false, "no", "none" or an empty list or map: the key asks for nothing.
bool unset(const YAML::Node& n) {
  if (!n || n.IsNull()) return true;
  if (n.IsSequence() || n.IsMap()) return n.size() == 0;
  const std::string v = lower(n.Scalar());
  return v.empty() || v == "false" || v == "no" || v == "none" || v == "null";
}

// The first document's events, walked before the nodes are read (an alias is one event, never
// expanded): a key given twice in one mapping is an error naming both lines, since PyYAML (so
// accelerate) keeps the last and yaml-cpp's lookup the first; a value over kMaxValueBytes is an
// error naming its key and length. See Note [accelerate configs].
class KeyChecker : public YAML::EventHandler {
 public:
  explicit KeyChecker(std::string path) : path_(std::move(path)) {}

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override {
    static const std::string kNull = "null";  // `~`, `null` and an empty key are one key to PyYAML
    item(mark, &kNull);
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { item(mark, nullptr); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string& value) override {
    item(mark, &value);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    item(mark, nullptr);
    levels_.emplace_back(/*is_map=*/false);
  }
  void OnSequenceEnd() override { levels_.pop_back(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    item(mark, nullptr);
    levels_.emplace_back(/*is_map=*/true);
  }
  void OnMapEnd() override { levels_.pop_back(); }

 private:
  struct Level {
    explicit Level(bool is_map) : map(is_map) {}
    bool map;
    bool at_key = true;                    // a mapping's next node is a key
    std::string key;                       // a mapping's current key
    int64_t index = -1;                    // a sequence's current item
    std::map<std::string, int64_t> lines;  // a mapping's keys by their (1-based) lines
  };

  // "deepspeed_config.zero_stage", "commands[2]": where a node of the first `depth` levels sits
  // (at most 200 bytes).
  std::string key_path(size_t depth) const {
    std::string out;
    for (size_t i = 0; i < depth && out.size() <= 200; ++i)
      out += levels_[i].map ? (out.empty() ? "" : ".") + levels_[i].key : "[" + std::to_string(levels_[i].index) + "]";
    return out.empty() ? "the top level" : out.size() <= 200 ? out : out.substr(0, 200) + "...";
  }

  // A node at `mark`: a key (`scalar` its text; nullptr for a key that is not a scalar) or a value.
  void item(const YAML::Mark& mark, const std::string* scalar) {
    const int64_t line = mark.line + 1;
    const bool key = !levels_.empty() && levels_.back().map && levels_.back().at_key;
    if (!levels_.empty()) {
      Level& top = levels_.back();
      if (top.map) top.at_key = !top.at_key;
      else ++top.index;
      if (key) top.key = scalar ? *scalar : "<a key that is not a single value>";
    }
    TORCH_CHECK_VALUE(!scalar || scalar->size() <= kMaxValueBytes, path_, ", line ", line, ": ",
                      key ? "a key in " + key_path(levels_.size() - 1) : key_path(levels_.size()), " is ",
                      scalar->size(), " bytes long; an accelerate config's keys and values (names, numbers, paths) "
                      "are at most ", kMaxValueBytes, " bytes");
    if (!key || !scalar) return;
    const auto [first, fresh] = levels_.back().lines.emplace(*scalar, line);
    TORCH_CHECK_VALUE(fresh, path_, ", line ", line, ": ", key_path(levels_.size()), " is given twice (lines ",
                      first->second, " and ", line, "); accelerate (PyYAML) would take the last and lockstep the "
                      "first, so delete one of them");
  }

  std::string path_;
  std::vector<Level> levels_;
};

class ConfigReader {
 public:
  explicit ConfigReader(std::string path) : path_(std::move(path)) {}

  // "c.yaml, line 4": the file and the line of `n`.
  std::string where(const YAML::Node& n) const { return path_ + ", line " + std::to_string(n.Mark().line + 1); }
  std::string text(const YAML::Node& n, const std::string& key) const {
    TORCH_CHECK_VALUE(n.IsScalar(), where(n), ": ", key, " must be a single value");
    return n.Scalar();
  }
  int64_t integer(const YAML::Node& n, const std::string& key, int64_t low) const {
    const std::string v = text(n, key);
    const c10::optional<int64_t> value = parse_integer(v);
    TORCH_CHECK_VALUE(value.has_value(), where(n), ": ", key, ": '", v, "' is not an integer");
    TORCH_CHECK_VALUE(*value >= low, where(n), ": ", key, ": ", *value, " must be at least ", low);
    return *value;
  }
  void unsupported(const std::string& key, const std::string& why) { unsupported_.push_back(key + ": " + why); }
  void worker_env(const char* name, const std::string& value, const std::string& key) {
    settings_.worker_env.emplace_back(name, value);
    settings_.origins.push_back(std::string(name) + "=" + value + " from " + key);
  }

  void read_processes(const YAML::Node& root);
  void read_distributed_type(const YAML::Node& root);
  void read_mixed_precision(const YAML::Node& root);
  void read_fsdp(const YAML::Node& fsdp);
  void read_deepspeed(const YAML::Node& ds);
  void read_other(const std::string& key, const YAML::Node& value);
  LaunchSettings finish(const AccelerateConfigOptions& options);

 private:
  std::string path_;
  LaunchSettings settings_;
  std::vector<std::string> unsupported_;  // "key: why"
};

// num_processes counts all machines' processes (accelerate divides it by num_machines).
void ConfigReader::read_processes(const YAML::Node& root) {
  const int64_t machines = root["num_machines"] ? integer(root["num_machines"], "num_machines", 1) : 1;
  if (root["num_machines"]) {
    settings_.nnodes = machines;
    settings_.origins.push_back("nnodes " + std::to_string(machines) + " from num_machines");
  }
  // -1 is accelerate's "not given" (ClusterConfig's default).
  if (root["num_processes"] && text(root["num_processes"], "num_processes") != "-1") {
    const int64_t total = integer(root["num_processes"], "num_processes", 1);
    TORCH_CHECK_VALUE(total % machines == 0, path_, ": num_processes ", total, " is not a multiple of num_machines ",
                      machines, "; num_processes counts the processes of all machines together");
    settings_.nproc_per_node = total / machines;
    settings_.origins.push_back("nproc per node " + std::to_string(total / machines) + " from num_processes " +
                                std::to_string(total) + " / num_machines " + std::to_string(machines));
  }
  if (root["machine_rank"]) {
    settings_.node_rank = integer(root["machine_rank"], "machine_rank", 0);
    TORCH_CHECK_VALUE(*settings_.node_rank < machines, path_, ": machine_rank ", *settings_.node_rank,
                      " is outside [0, ", machines, ") for num_machines ", machines);
    settings_.origins.push_back("node rank " + std::to_string(*settings_.node_rank) + " from machine_rank");
  }
  if (!unset(root["main_process_ip"])) {
    const std::string addr = text(root["main_process_ip"], "main_process_ip");
    TORCH_CHECK_VALUE(addr.size() <= kMaxHostNameBytes, where(root["main_process_ip"]), ": main_process_ip is ",
                      addr.size(), " bytes long; a host name is at most ", kMaxHostNameBytes,
                      " bytes (RFC 1035): give node 0's host name or IP address");
    settings_.master_addr = addr;
    settings_.origins.push_back("master address " + addr + " from main_process_ip");
  }
  if (root["main_process_port"] && !root["main_process_port"].IsNull()) {
    const int64_t port = integer(root["main_process_port"], "main_process_port", 0);
    // See Note [Launcher rendezvous port].
    TORCH_CHECK_VALUE(port + kRendezvousPortOffset <= 65535, where(root["main_process_port"]), ": main_process_port ",
                      port, " leaves no port for the launchers: the workers listen on main_process_port and "
                      "lockstep's launchers meet on the next port (main_process_port + 1), so give a port in [1, ",
                      65535 - kRendezvousPortOffset, "], or 0 to pick a free one");
    settings_.master_port = static_cast<int>(port);  // 0: a free port, as in accelerate
    settings_.origins.push_back("master port " + std::to_string(port) + " from main_process_port");
  }
}

void ConfigReader::read_distributed_type(const YAML::Node& root) {
  TORCH_CHECK_VALUE(root["distributed_type"], path_, ": no distributed_type (accelerate requires one: NO, "
                    "MULTI_CPU, MULTI_GPU, FSDP, DEEPSPEED, ...)");
  const std::string type = text(root["distributed_type"], "distributed_type");
  if (type == "NO") {
    worker_env(kStrategyEnv, "local", "distributed_type NO");
  } else if (type == "FSDP") {
    read_fsdp(root["fsdp_config"]);
  } else if (type == "DEEPSPEED") {
    read_deepspeed(root["deepspeed_config"]);
  } else if (type.rfind("MULTI_", 0) == 0) {
    // MULTI_CPU, MULTI_GPU, MULTI_XPU, ...: data parallel, one process per device (here per core).
    worker_env(kStrategyEnv, "ddp", "distributed_type " + type);
  } else if (type == "MEGATRON_LM" || type == "XLA" || type == "TPU") {
    unsupported("distributed_type " + type, "lockstep has no " + type + " engine; the run uses its default strategy");
  } else {
    TORCH_CHECK_VALUE(false, path_, ": distributed_type '", type, "' is not one of accelerate's (NO, MULTI_CPU, "
                      "MULTI_GPU, FSDP, DEEPSPEED, MEGATRON_LM, XLA, ...)");
  }
}

void ConfigReader::read_mixed_precision(const YAML::Node& root) {
  if (!root["mixed_precision"] || root["mixed_precision"].IsNull()) return;
  const std::string mp = lower(text(root["mixed_precision"], "mixed_precision"));
  if (mp == "no") {
    worker_env(kPrecisionEnv, "fp32", "mixed_precision no");
  } else if (mp == "bf16" || mp == "fp16") {
    worker_env(kPrecisionEnv, mp, "mixed_precision " + mp);
  } else if (mp == "fp8") {
    unsupported("mixed_precision fp8", "needs Transformer Engine or MS-AMP on GPUs; the run trains in fp32");
  } else {
    TORCH_CHECK_VALUE(false, path_, ": mixed_precision '", mp, "' is not no, fp16, bf16 or fp8");
  }
}

// fsdp_config: the sharding strategy picks the lockstep strategy; the rest are HF loading and
// wrapping details, or tuning (prefetch) that lockstep's FSDP decides itself.
void ConfigReader::read_fsdp(const YAML::Node& fsdp) {
  std::string sharding = "FULL_SHARD";
  if (fsdp && fsdp["fsdp_sharding_strategy"]) {
    sharding = text(fsdp["fsdp_sharding_strategy"], "fsdp_config.fsdp_sharding_strategy");
  } else if (fsdp && fsdp["fsdp_reshard_after_forward"]) {
    // FSDP2's spelling: resharding after forward is FULL_SHARD, keeping the gathered parameters
    // until backward is SHARD_GRAD_OP.
    sharding = unset(fsdp["fsdp_reshard_after_forward"]) ? "SHARD_GRAD_OP" : "FULL_SHARD";
  }
  // accelerate also takes FSDP's ShardingStrategy numbers: 1 FULL_SHARD, 2 SHARD_GRAD_OP, 3 NO_SHARD,
  // 4 HYBRID_SHARD, 5 HYBRID_SHARD_ZERO2.
  const std::vector<std::string> numbered{"", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                          "HYBRID_SHARD_ZERO2"};
  if (sharding.size() == 1 && sharding[0] >= '1' && sharding[0] <= '5') sharding = numbered[sharding[0] - '0'];
  const std::string key = "fsdp_sharding_strategy " + sharding;
  if (sharding == "FULL_SHARD") {
    worker_env(kStrategyEnv, "fsdp", key);
  } else if (sharding == "SHARD_GRAD_OP") {
    worker_env(kStrategyEnv, "zero2", key);
  } else if (sharding == "NO_SHARD") {
    worker_env(kStrategyEnv, "ddp", key);
  } else if (sharding == "HYBRID_SHARD" || sharding == "HYBRID_SHARD_ZERO2") {
    unsupported("fsdp_config." + key, "lockstep shards over all ranks, not within nodes; the run uses full sharding");
    worker_env(kStrategyEnv, sharding == "HYBRID_SHARD" ? "fsdp" : "zero2", key);
  } else {
    TORCH_CHECK_VALUE(false, path_, ": fsdp_config.fsdp_sharding_strategy '", sharding,
                      "' is not FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or HYBRID_SHARD_ZERO2");
  }
  if (!fsdp) return;
  if (!unset(fsdp["fsdp_offload_params"]))
    unsupported("fsdp_config.fsdp_offload_params", "lockstep keeps parameters in memory (no CPU offload: it trains on "
                "the CPU already)");
  if (!unset(fsdp["fsdp_activation_checkpointing"]))
    worker_env(kCheckpointActivationsEnv, "true", "fsdp_config.fsdp_activation_checkpointing");
  if (fsdp["fsdp_min_num_params"] && lower(fsdp["fsdp_auto_wrap_policy"].as<std::string>("")) == "size_based_wrap")
    worker_env(kFsdpMinParamsEnv,
               std::to_string(integer(fsdp["fsdp_min_num_params"], "fsdp_config.fsdp_min_num_params", 0)),
               "fsdp_config.fsdp_min_num_params");
}

// deepspeed_config: a DeepSpeed JSON file (read by `lockstep train`), or accelerate's own keys.
void ConfigReader::read_deepspeed(const YAML::Node& ds) {
  if (!ds) {
    worker_env(kStrategyEnv, "zero1", "distributed_type DEEPSPEED (no deepspeed_config: ZeRO stage 1)");
    return;
  }
  if (!unset(ds["deepspeed_config_file"]))
    worker_env(kDeepSpeedConfigEnv, text(ds["deepspeed_config_file"], "deepspeed_config.deepspeed_config_file"),
               "deepspeed_config.deepspeed_config_file");
  if (ds["zero_stage"]) {
    const int64_t stage = integer(ds["zero_stage"], "deepspeed_config.zero_stage", 0);
    TORCH_CHECK_VALUE(stage <= 3, path_, ": deepspeed_config.zero_stage ", stage, " is not 0, 1, 2 or 3");
    const char* names[] = {"ddp", "zero1", "zero2", "fsdp"};
    worker_env(kStrategyEnv, names[stage], "deepspeed_config.zero_stage " + std::to_string(stage));
  }
  if (ds["gradient_accumulation_steps"] && ds["gradient_accumulation_steps"].as<std::string>("") != "auto")
    worker_env(kAccumStepsEnv,
               std::to_string(integer(ds["gradient_accumulation_steps"], "deepspeed_config.gradient_accumulation_steps", 1)),
               "deepspeed_config.gradient_accumulation_steps");
  if (ds["gradient_clipping"] && ds["gradient_clipping"].as<std::string>("") != "auto")
    worker_env(kClipNormEnv, text(ds["gradient_clipping"], "deepspeed_config.gradient_clipping"),
               "deepspeed_config.gradient_clipping");
  for (const char* key : {"offload_optimizer_device", "offload_param_device"})
    if (!unset(ds[key]))
      unsupported(std::string("deepspeed_config.") + key + " " + ds[key].as<std::string>(""),
                  "lockstep does not offload to CPU or NVMe (it trains on the CPU already); nothing is offloaded");
  for (const char* key : {"offload_optimizer_nvme_path", "offload_param_nvme_path"})
    if (!unset(ds[key])) unsupported(std::string("deepspeed_config.") + key, "lockstep has no NVMe offload");
  for (const char* key : {"deepspeed_hostfile", "deepspeed_inclusion_filter", "deepspeed_exclusion_filter"})
    if (!unset(ds[key]))
      unsupported(std::string("deepspeed_config.") + key, "lockstep run starts the workers of its own node only; "
                  "run it on each node (or under srun, mpirun or a PyTorchJob)");
  if (!unset(ds["deepspeed_moe_layer_cls_names"]))
    unsupported("deepspeed_config.deepspeed_moe_layer_cls_names", "lockstep has no mixture-of-experts layers");
}

// Every other top-level key: inert, or asking for something lockstep does not do.
void ConfigReader::read_other(const std::string& key, const YAML::Node& value) {
  if (kInert.count(key) != 0 || unset(value)) return;
  if (key == "compute_environment") {
    if (value.as<std::string>("") != "LOCAL_MACHINE")
      unsupported(key + " " + value.as<std::string>(""), "lockstep run starts processes on this machine only");
  } else if (key == "rdzv_backend") {
    const std::string v = value.as<std::string>("");
    if (v != "static" && v != "c10d")
      unsupported(key + " " + v, "lockstep run meets in a TCP store on node 0 (static and c10d both mean that)");
  } else if (key == "dynamo_config") {
    if (!value.IsMap() || value["dynamo_backend"].as<std::string>("NO") != "NO")
      unsupported(key, "LibTorch has no torch.compile; the model runs eagerly");
  } else if (key == "fp8_config" || key == "megatron_lm_config" || key == "parallelism_config" ||
             key == "mpirun_config" || key == "ipex_config") {
    unsupported(key, "lockstep has no such engine; the keys are not applied");
  } else if (key == "debug" || key == "enable_cpu_affinity" || key == "downcast_bf16") {
    unsupported(key, "lockstep has no such mode; the run goes on without it");
  } else {
    unsupported(key, "not an accelerate config key lockstep knows; it is not applied");
  }
}

LaunchSettings ConfigReader::finish(const AccelerateConfigOptions& options) {
  if (options.strict() && !unsupported_.empty())
    TORCH_CHECK_VALUE(false, path_, ": ", unsupported_.size(), " key(s) lockstep does not support (strict): ",
                      c10::Join("; ", unsupported_));
  for (const std::string& line : unsupported_)
    report(options.reporter(), ReportKind::kWarning, path_ + ": " + line);
  return settings_;
}

}  // namespace

LaunchSettings accelerate_launch_settings(const std::string& path, const AccelerateConfigOptions& options) {
  std::ifstream file(path);
  TORCH_CHECK_VALUE(file.good(), "cannot read the accelerate config '", path,
                    "'; give the path of a YAML or JSON file");
  std::stringstream text;
  text << file.rdbuf();
  YAML::Node root;
  try {
    KeyChecker checker(path);
    YAML::Parser events(text);
    events.HandleNextDocument(checker);
    root = YAML::Load(text.str());
  } catch (const YAML::Exception& e) {
    TORCH_CHECK_VALUE(false, path, " is not valid YAML (line ", e.mark.line + 1, "): ", yaml_error_text(e));
  }
  TORCH_CHECK_VALUE(root.IsMap(), path, " is not an accelerate config: expected keys and values such as "
                    "distributed_type and num_processes");
  ConfigReader reader(path);
  const std::set<std::string> handled{"num_processes",    "num_machines", "machine_rank",   "main_process_ip",
                                      "main_process_port", "distributed_type", "mixed_precision", "fsdp_config",
                                      "deepspeed_config"};
  try {
    reader.read_processes(root);
    reader.read_distributed_type(root);
    reader.read_mixed_precision(root);
    for (const auto& entry : root) {
      TORCH_CHECK_VALUE(entry.first.IsScalar(), reader.where(entry.first), ": a key that is not a single value; "
                        "accelerate's keys are names such as distributed_type");
      const std::string key = entry.first.as<std::string>();
      if (handled.count(key) == 0) reader.read_other(key, entry.second);
    }
  } catch (const YAML::Exception& e) {  // a value of a shape no check above expected (the fuzzer's
                                         // fsdp_config: a scalar), named with its file
    TORCH_CHECK_VALUE(false, path, ", line ", e.mark.line + 1, ": ", yaml_error_text(e));
  }
  return reader.finish(options);
}

}  // namespace lockstep::launch
