// See Note [DeepSpeed configs].
#include "lockstep/train/deepspeed_config.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "deepspeed_reader.h"
#include "lockstep/core/names.h"

namespace lockstep::train {
namespace deepspeed {
namespace {

// Tuning and diagnostics that change neither the numbers nor what is kept where.
const std::set<std::string> kInertTopLevel{
    "steps_per_print", "wall_clock_breakdown", "dump_state", "memory_breakdown", "prescale_gradients",
    "gradient_predivide_factor", "sparse_gradients", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
    "disable_allgather", "gradient_accumulation_dtype", "train_batch_size", "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps"};
const std::set<std::string> kInertZero{
    "stage", "allgather_partitions", "allgather_bucket_size", "overlap_comm", "reduce_scatter", "reduce_bucket_size",
    "contiguous_gradients", "sub_group_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
    "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "round_robin_gradients", "elastic_checkpoint",
    "load_from_fp32_weights", "ignore_unused_parameters", "legacy_stage1", "memory_efficient_linear",
    "use_multi_rank_bucket_allreduce", "stage3_module_granularity_threshold", "log_trace_cache_warnings",
    "use_all_reduce_for_fetch_params"};
// Sections lockstep has no counterpart for, and why.
const std::vector<std::pair<std::string, std::string>> kUnsupportedSections{
    {"wandb", "lockstep logs to JSONL and TensorBoard only"},
    {"csv_monitor", "lockstep logs to JSONL and TensorBoard only"},
    {"comet", "lockstep logs to JSONL and TensorBoard only"},
    {"flops_profiler", "lockstep has no FLOPs profiler (its step profiler times the phases)"},
    {"comms_logger", "lockstep has no communication logger"},
    {"autotuning", "lockstep does not autotune"},
    {"activation_checkpointing", "configures DeepSpeed's checkpointing API; lockstep's activation "
                                 "checkpointing is the trainer's checkpoint_activations option"},
    {"pipeline", "configures DeepSpeed's pipeline engine; lockstep's pipeline strategy has its own options"},
    {"compression_training", "lockstep has no quantization or pruning during training"},
    {"data_efficiency", "lockstep has no curriculum or token dropping"},
    {"curriculum_learning", "lockstep has no curriculum learning"},
    {"progressive_layer_drop", "lockstep has no progressive layer dropping"},
    {"quantize_training", "lockstep has no quantized training"},
    {"sparse_attention", "lockstep has no sparse attention"},
    {"eigenvalue", "lockstep does not compute eigenvalues"},
    {"hybrid_engine", "lockstep has no hybrid inference engine"},
    {"elasticity", "lockstep's membership is fixed for a run"},
    {"aio", "lockstep has no NVMe offload"},
    {"nebula", "lockstep checkpoints with its own checkpointer"},
    {"checkpoint", "lockstep checkpoints with its own checkpointer"},
    {"data_types", "lockstep accumulates gradients in the parameters' type"},
    {"compile", "LibTorch has no torch.compile"},
    {"communication_data_type", "lockstep communicates gradients in their own type"},
};

}  // namespace

// train_batch_size = micro x accumulation x world size; DeepSpeed's rule for which two give the
// third. "auto" or a missing micro-batch or accumulation takes the command line's value.
void Reader::read_batch(const json& c) {
  TrainerOptions& t = o_.trainer();
  const int64_t world = how_.world_size();
  c10::optional<int64_t> micro = count(c, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu");
  c10::optional<int64_t> accum = count(c, "gradient_accumulation_steps", "gradient_accumulation_steps");
  const c10::optional<int64_t> total = count(c, "train_batch_size", "train_batch_size");
  if (micro) agree(how_.given().batch_size, t.batch_size(), *micro, "train_micro_batch_size_per_gpu", "batch size");
  if (accum) agree(how_.given().accum_steps, t.accum_steps(), *accum, "gradient_accumulation_steps", "accum steps");
  const bool auto_micro = c.contains("train_micro_batch_size_per_gpu") && is_auto(c["train_micro_batch_size_per_gpu"]);
  const bool auto_accum = c.contains("gradient_accumulation_steps") && is_auto(c["gradient_accumulation_steps"]);
  if (!micro && (auto_micro || how_.given().batch_size)) micro = t.batch_size();
  if (!accum && (auto_accum || how_.given().accum_steps)) accum = t.accum_steps();
  const std::string world_words = "world size " + std::to_string(world) + " (the processes the launcher started)";
  if (total && micro && accum) {
    TORCH_CHECK_VALUE(*total == *micro * *accum * world, source_, ": train_batch_size ", *total,
                      " is not train_micro_batch_size_per_gpu ", *micro, " x gradient_accumulation_steps ", *accum,
                      " x ", world_words, " = ", *micro * *accum * world, "; set train_batch_size to ",
                      *micro * *accum * world, " or \"auto\", or change the others");
  } else if (total && (micro || accum)) {
    const int64_t known = micro ? *micro : *accum;
    const char* known_key = micro ? "train_micro_batch_size_per_gpu" : "gradient_accumulation_steps";
    const char* inferred_key = micro ? "gradient_accumulation_steps" : "train_micro_batch_size_per_gpu";
    TORCH_CHECK_VALUE(*total % (known * world) == 0, source_, ": train_batch_size ", *total, " is not divisible by ",
                      known_key, " ", known, " x ", world_words, ", so ", inferred_key,
                      " cannot be inferred; make train_batch_size a multiple of ", known * world);
    (micro ? accum : micro) = *total / (known * world);
  } else if (total) {
    TORCH_CHECK_VALUE(*total % world == 0, source_, ": train_batch_size ", *total, " is not divisible by the ",
                      world_words, "; make it a multiple of ", world, " or give train_micro_batch_size_per_gpu");
    accum = 1;  // DeepSpeed's choice when only the total is given
    micro = *total / world;
  }
  if (micro) t.batch_size(*micro);
  if (accum) t.accum_steps(*accum);
}

// ZeRO stage 0/1/2/3 as a strategy; offload and ZeRO++ quantization are not available.
void Reader::read_zero(const json& given) {
  const json z = given.is_boolean() ? json{{"stage", given.get<bool>() ? 1 : 0}} : given;  // DeepSpeed's old form
  if (!z.is_object()) return;
  if (const c10::optional<double> stage = number(z, "stage", "zero_optimization.stage")) {
    TORCH_CHECK_VALUE(*stage == 0 || *stage == 1 || *stage == 2 || *stage == 3, source_,
                      ": zero_optimization.stage is ", *stage, "; DeepSpeed's stages are 0, 1, 2 and 3");
    static const std::vector<parallel::StrategyKind> kStages{
        parallel::StrategyKind::kDdp, parallel::StrategyKind::kZero1, parallel::StrategyKind::kZero2,
        parallel::StrategyKind::kFsdp};
    const parallel::StrategyKind kind = kStages[static_cast<size_t>(*stage)];
    // Stage 0 is plain data parallelism, and any stage on one process shards over one rank, which
    // is no sharding (DeepSpeed runs it as such): they decide nothing the default would not.
    if ((*stage > 0 && how_.world_size() > 1) || how_.given().strategy) {
      const std::string& name = parallel::to_string(kind);
      if (o_.trainer().strategy())
        agree(how_.given().strategy, parallel::to_string(*o_.trainer().strategy()), name,
              "zero_optimization.stage " + std::to_string(static_cast<int>(*stage)) + " (strategy)", "strategy");
      if (*stage > 0 && how_.world_size() > 1) o_.trainer().strategy(kind);
    }
  }
  for (const char* key : {"offload_optimizer", "offload_param"}) {
    if (!z.contains(key) || disabled(z[key])) continue;
    const json& device = z[key].is_object() && z[key].contains("device") ? z[key]["device"] : json("cpu");
    if (device.is_string() && (device.get<std::string>() == "none" || is_auto(device))) continue;
    unsupported(std::string("zero_optimization.") + key + ".device " + device.dump(),
                "lockstep does not offload to CPU memory or NVMe (it trains on the CPU already); nothing is moved");
  }
  for (const char* key : {"cpu_offload", "cpu_offload_params", "cpu_offload_use_pin_memory"})
    if (z.contains(key) && !disabled(z[key]))
      unsupported(std::string("zero_optimization.") + key, "lockstep does not offload; nothing is moved");
  for (const auto& [key, value] : z.items()) {
    if (kInertZero.count(key) != 0 || key.rfind("offload_", 0) == 0 || key.rfind("cpu_offload", 0) == 0) continue;
    if (disabled(value) || (value.is_number() && value.get<double>() <= 1)) continue;  // e.g. zero_hpz_partition_size 1
    unsupported("zero_optimization." + key, key.rfind("zero_quantized", 0) == 0
                                                ? "ZeRO++ quantized communication; lockstep communicates in full precision"
                                                : "not a ZeRO setting lockstep has; it is not applied");
  }
}

// bf16 / fp16 (and the older amp and bfloat16 sections): the training precision. fp16 is applied as
// asked; a CPU run then refuses it at start with the same hint as any fp16 run.
void Reader::read_precision(const json& c) {
  c10::optional<Precision> p;
  std::string key;
  for (const char* section : {"bf16", "bfloat16"})
    if (const c10::optional<bool> on = enabled(c, section); on && *on) p = Precision::kBf16, key = section;
  if (const c10::optional<bool> on = enabled(c, "fp16"); on && *on) {
    TORCH_CHECK_VALUE(!p, source_, ": both ", key, " and fp16 are enabled; enable one of them");
    p = Precision::kFp16, key = "fp16";
    const c10::optional<double> scale = number(c["fp16"], "loss_scale", "fp16.loss_scale");
    if (scale) o_.loss_scale(*scale == 0 ? std::string("dynamic") : c10::str(*scale));  // 0: DeepSpeed's dynamic
  }
  if (const c10::optional<bool> on = enabled(c, "amp"); on && *on) {
    TORCH_CHECK_VALUE(!p, source_, ": both ", key, " and amp are enabled; enable one of them");
    p = Precision::kFp16, key = "amp";  // Apex amp, as DeepSpeed runs it, is fp16
    if (c["amp"].contains("opt_level") && c["amp"]["opt_level"].is_string())
      o_.opt_level(enum_from_name<amp::OptLevel>(amp::opt_level_names(), c["amp"]["opt_level"].get<std::string>(),
                                                 "amp.opt_level"));
  }
  if (!p) return;
  agree(how_.given().precision, enum_name(precision_names(), o_.precision()), enum_name(precision_names(), *p),
        key + ".enabled", "precision");
  o_.precision(*p);
}

void Reader::read_other(const std::string& key, const json& value) {
  static const std::set<std::string> handled{"zero_optimization", "bf16", "bfloat16", "fp16", "amp",
                                             "gradient_clipping", "optimizer", "scheduler", "tensorboard"};
  if (handled.count(key) != 0 || kInertTopLevel.count(key) != 0 || disabled(value)) return;
  for (const auto& [section, why] : kUnsupportedSections) {
    if (section != key) continue;
    if (key == "communication_data_type" && value.is_string() && lower(value.get<std::string>()) == "fp32") return;
    unsupported(key, why);
    return;
  }
  unsupported(key, "not a DeepSpeed key lockstep knows; it is not applied");
}

void Reader::finish() const {
  if (how_.strict() && !unsupported_.empty())
    TORCH_CHECK_VALUE(false, source_, ": ", unsupported_.size(), " setting(s) lockstep does not support (strict): ",
                      c10::Join("; ", unsupported_));
  for (const std::string& line : unsupported_) report(how_.reporter(), ReportKind::kWarning, source_ + ": " + line);
}

namespace {

// with_deepspeed_config, with the lines of a file's keys for its messages.
TrainOptions apply_with_lines(TrainOptions options, const json& config, const std::string& source,
                              const DeepSpeedConfigOptions& how, const KeyLines& lines) {
  TORCH_CHECK_VALUE(config.is_object(), source, " is not a DeepSpeed config: expected a JSON object of keys such as "
                    "train_batch_size and zero_optimization");
  TORCH_CHECK_VALUE(how.world_size() >= 1, "world_size ", how.world_size(), " must be at least 1");
  check_shapes(config, source, lines);
  Reader r(options, source, how);
  r.read_batch(config);
  if (config.contains("zero_optimization")) r.read_zero(config["zero_optimization"]);
  r.read_precision(config);
  if (const c10::optional<double> clip = r.number(config, "gradient_clipping", "gradient_clipping")) {
    TORCH_CHECK_VALUE(*clip >= 0, where(source, lines, "gradient_clipping"), ": gradient_clipping is ", *clip,
                      "; give a norm >= 0 (0: off)");
    r.agree(how.given().clip_norm, options.trainer().strategy_options().clip_norm(), *clip, "gradient_clipping",
            "clip norm");
    options.trainer().strategy_options().clip_norm(*clip);
  }
  if (config.contains("optimizer")) r.read_optimizer(config["optimizer"]);
  if (config.contains("scheduler")) r.read_scheduler(config["scheduler"]);
  if (config.contains("tensorboard") && !disabled(config["tensorboard"]) && options.trainer().log().tensorboard().empty()) {
    const json& tb = config["tensorboard"];
    const std::string dir = tb.value("output_path", std::string("runs"));
    const std::string job = tb.value("job_name", std::string("DeepSpeedJobName"));  // DeepSpeed's default
    options.trainer().log().tensorboard(dir.empty() ? job : dir + "/" + job);
  }
  for (const auto& [key, value] : config.items()) r.read_other(key, value);
  r.finish();
  return options;
}

}  // namespace
}  // namespace deepspeed

using nlohmann::json;

TrainOptions with_deepspeed_config(TrainOptions options, const json& config, const std::string& source,
                                   const DeepSpeedConfigOptions& how) {
  return deepspeed::apply_with_lines(std::move(options), config, source, how, {});
}

TrainOptions with_deepspeed_config_file(TrainOptions options, const std::string& path,
                                        const DeepSpeedConfigOptions& how) {
  std::ifstream in(path);
  TORCH_CHECK_VALUE(in.good(), "cannot read the DeepSpeed config '", path, "'; give the path of a JSON file");
  std::stringstream text;
  text << in.rdbuf();
  deepspeed::KeyLines lines;
  const json config = deepspeed::parse_config_file(path, text.str(), lines);
  return deepspeed::apply_with_lines(std::move(options), config, path, how, lines);
}

}  // namespace lockstep::train
