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

// Where each key of a config file sits, "optimizer.params.lr" -> its line (1-based). Empty for a
// config that did not come from a file.
using KeyLines = std::map<std::string, int64_t>;
// DeepSpeed configs nest four levels at most; deeper nesting is refused while parsing.
constexpr size_t kMaxJsonDepth = 100;

// `s` as a message shows it: at most `most` bytes.
std::string clipped(const std::string& s, size_t most = 80) {
  return s.size() <= most ? s : s.substr(0, most) + "... (" + std::to_string(s.size()) + " bytes)";
}

// A value as an error shows it: scalars as written (long strings cut), containers by their kind.
std::string shown(const json& v) {
  return v.is_object() ? "an object" : v.is_array() ? "an array" : clipped(v.dump());
}

// "ds.json, line 3" where the key's line is known, else "ds.json".
std::string where(const std::string& source, const KeyLines& lines, const std::string& key) {
  const auto it = lines.find(key);
  return it == lines.end() ? source : source + ", line " + std::to_string(it->second);
}

// The JSON text of `path` as a config, refusing a key given twice in one object (DeepSpeed refuses
// it; Python's json alone keeps the last), a number beyond a double, nesting deeper than
// kMaxJsonDepth. Errors name the file, the key and the line.
class JsonFileParser {
 public:
  JsonFileParser(std::string path, std::string text) : path_(std::move(path)), text_(std::move(text)) {}

  json parse() {
    std::stringbuf buf(text_);
    std::istream in(&buf);
    // The lexer reads one character at a time: the buffer's position is where it stands.
    const auto position = [&buf] { return static_cast<size_t>(buf.pubseekoff(0, std::ios::cur, std::ios::in)); };
    try {
      return json::parse(
          in, [&](int, json::parse_event_t event, json& parsed) { return on_event(event, parsed, position()); },
          /*allow_exceptions=*/true, /*ignore_comments=*/true);
    } catch (const json::parse_error& e) {
      TORCH_CHECK_VALUE(false, path_, " is not valid JSON: ", clipped(e.what(), 300));
    } catch (const json::exception& e) {  // out_of_range 406: a number beyond a double, such as 1e400
      const size_t at = position();       // just past the number and the character after it
      const std::string what = e.what();  // "[json.exception.out_of_range.406] number overflow ..."
      TORCH_CHECK_VALUE(false, path_, ", line ", line_at(at == 0 ? 0 : at - 1), ": ", key_path(), ": ",
                        clipped(what.substr(what.find("] ") + 2), 300),
                        ", beyond a double's range (about 1.8e308); give a finite number");
    }
    return json();
  }
  const KeyLines& lines() const { return lines_; }

 private:
  struct Level {
    explicit Level(bool is_object) : object(is_object) {}
    bool object;
    std::string key;                       // an object's current key
    int64_t index = 0;                     // an array's current item
    std::map<std::string, int64_t> lines;  // an object's keys by their lines
  };

  bool on_event(json::parse_event_t event, const json& parsed, size_t at) {
    using Event = json::parse_event_t;
    if (event == Event::object_start || event == Event::array_start) {
      TORCH_CHECK_VALUE(levels_.size() < kMaxJsonDepth, path_, ", line ", line_at(at), ": ", key_path(),
                        " nests more than ", kMaxJsonDepth, " levels deep; a DeepSpeed config nests a few");
      levels_.emplace_back(event == Event::object_start);
    } else if (event == Event::key) {
      Level& top = levels_.back();
      top.key = parsed.get<std::string>();
      const int64_t line = line_at(at);  // the lexer stands just past the key's closing quote
      const auto [first, fresh] = top.lines.emplace(top.key, line);
      TORCH_CHECK_VALUE(fresh, path_, ", line ", line, ": ", key_path(), " is given twice (lines ", first->second,
                        " and ", line, "); DeepSpeed refuses duplicate keys too: delete one of them");
      lines_.emplace(key_path(), line);
    } else if (event == Event::object_end || event == Event::array_end) {
      levels_.pop_back();
    }
    // An array's item is complete: the next one is its next index.
    if ((event == Event::value || event == Event::object_end || event == Event::array_end) && !levels_.empty() &&
        !levels_.back().object)
      ++levels_.back().index;
    return true;
  }

  // "optimizer.params.betas[1]": where the parser stands (at most 200 bytes).
  std::string key_path() const {
    std::string out;
    for (const Level& level : levels_) {
      if (level.object) {
        if (!out.empty()) out += '.';
        out += clipped(level.key);
      } else {
        out += '[' + std::to_string(level.index) + ']';
      }
      if (out.size() > 200) return clipped(out, 200);
    }
    return out.empty() ? "the top level" : out;
  }
  // The line of byte `at`; the lexer moves forward, so each byte is counted about once.
  int64_t line_at(size_t at) {
    for (at = std::min(at, text_.size()); counted_ < at; ++counted_) newlines_ += text_[counted_] == '\n';
    for (; counted_ > at; --counted_) newlines_ -= text_[counted_ - 1] == '\n';
    return newlines_ + 1;
  }

  std::string path_;
  std::string text_;
  std::vector<Level> levels_;
  KeyLines lines_;
  size_t counted_ = 0;   // bytes of text_ whose newlines are counted
  int64_t newlines_ = 0;
};

enum class Shape { kSection, kBoolean, kString };
struct KeyShape {
  const char* key;  // dotted: a section's own keys follow it
  Shape shape;
  const char* example;
};
// The sections lockstep reads and the values it reads without a type check of their own: of the
// wrong type, each would be skipped silently (and DeepSpeed fails on it, or reads it otherwise).
// A section may be null (absent).
const std::vector<KeyShape> kKeyShapes{
    {"zero_optimization", Shape::kSection, R"({"stage": 2})"},
    {"zero_optimization.offload_optimizer", Shape::kSection, R"({"device": "cpu"})"},
    {"zero_optimization.offload_param", Shape::kSection, R"({"device": "cpu"})"},
    {"bf16", Shape::kSection, R"({"enabled": true})"},
    {"bfloat16", Shape::kSection, R"({"enabled": true})"},
    {"fp16", Shape::kSection, R"({"enabled": true, "loss_scale": 0})"},
    {"amp", Shape::kSection, R"({"enabled": true, "opt_level": "O1"})"},
    {"amp.opt_level", Shape::kString, R"("O1")"},
    {"optimizer", Shape::kSection, R"({"type": "AdamW", "params": {"lr": 0.001}})"},
    {"optimizer.params", Shape::kSection, R"({"lr": 0.001})"},
    {"optimizer.params.adam_w_mode", Shape::kBoolean, "true"},
    {"optimizer.params.amsgrad", Shape::kBoolean, "false"},
    {"optimizer.params.bias_correction", Shape::kBoolean, "true"},
    {"scheduler", Shape::kSection, R"({"type": "WarmupLR", "params": {"warmup_num_steps": 100}})"},
    {"scheduler.params", Shape::kSection, R"({"warmup_num_steps": 100})"},
    {"scheduler.params.warmup_type", Shape::kString, R"("linear")"},
    {"tensorboard", Shape::kSection, R"({"enabled": true, "output_path": "runs"})"},
    {"tensorboard.enabled", Shape::kBoolean, "true"},
    {"tensorboard.output_path", Shape::kString, R"("runs")"},
    {"tensorboard.job_name", Shape::kString, R"("my_job")"},
};

// A known key of the wrong type is an error, strict or not. See Note [DeepSpeed configs].
void check_shapes(const json& config, const std::string& source, const KeyLines& lines) {
  for (const KeyShape& k : kKeyShapes) {
    const std::string key = k.key;
    const json* v = &config;
    for (size_t begin = 0; v != nullptr && begin <= key.size();) {
      const size_t end = std::min(key.find('.', begin), key.size());
      const std::string part = key.substr(begin, end - begin);
      v = v->is_object() && v->contains(part) ? &(*v)[part] : nullptr;
      begin = end + 1;
    }
    if (v == nullptr) continue;  // absent, or its section is not an object (reported before it)
    // DeepSpeed still reads zero_optimization's old boolean form (true: stage 1); so does read_zero.
    const bool fits = key == "zero_optimization" && v->is_boolean() ? true
                      : k.shape == Shape::kSection ? v->is_object() || v->is_null()
                      : k.shape == Shape::kBoolean ? v->is_boolean()
                                                   : v->is_string();
    TORCH_CHECK_VALUE(fits, where(source, lines, key), ": ", key, " is ", shown(*v), "; ",
                      k.shape == Shape::kSection ? "it is a section: write it as an object such as "
                      : k.shape == Shape::kBoolean ? "give true or false, such as "
                                                   : "give a string such as ",
                      k.example, " (strict or not: skipped, it would train something else)");
  }
}

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
  deepspeed::JsonFileParser parser(path, text.str());
  const json config = parser.parse();
  return deepspeed::apply_with_lines(std::move(options), config, path, how, parser.lines());
}

}  // namespace lockstep::train
