#include "lockstep/train/checkpoint.h"

#include <torch/serialize.h>

#include <algorithm>
#include <cmath>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/ivalue_dict.h"
#include "lockstep/core/torch_load.h"
#include "lockstep/core/torch_save.h"
#include "lockstep/train/sharded_checkpoint.h"

namespace lockstep::train {
namespace {

namespace fs = std::filesystem;
using c10::IValue;
using GenericDict = c10::impl::GenericDict;

constexpr const char* kFormat = "lockstep-checkpoint-1";
constexpr const char* kPrefix = "step-";
constexpr const char* kSuffix = ".pt";

// The entry `key` of `dict`, or an error naming what is missing from where.
IValue entry(const GenericDict& dict, const std::string& key, const std::string& source) {
  return dict_entry(dict, key, source, ": it is not a complete lockstep checkpoint");
}

// Step number of a checkpoint file name (step-N.pt), or of a sharded checkpoint's directory name
// (step-N) when `directory`; -1 when `name` is not one.
int64_t step_of(const std::string& name, bool directory = false) {
  const std::string prefix = kPrefix, suffix = directory ? "" : kSuffix;
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 18 ||  // 18 digits always fit in int64_t
      !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
    return -1;
  return std::stoll(digits);
}

// The entries of an unpickled checkpoint; see load_checkpoint.
Checkpoint parse_checkpoint(const IValue& top_value, const std::string& source) {
  const GenericDict top = as_dict(top_value, source);
  const IValue format = entry(top, "format", source);
  TORCH_CHECK(format.isString() && format.toStringRef() == kFormat, source, " has format ",
              format.isString() ? "'" + format.toStringRef() + "'" : format.tagKind(), "; this lockstep reads '",
              kFormat, "'");

  Checkpoint c;
  read_position_and_run(top, source, c);
  c.model = entry(top, "model", source);
  c.optimizer = entry(top, "optimizer", source);
  c.scaler = entry(top, "scaler", source);
  const IValue rng = entry(top, "rng", source);
  TORCH_CHECK_VALUE(rng.isList(), source, " rng is a ", rng.tagKind(), ", not a list of generator states");
  for (const IValue& t : rng.toListRef()) {
    TORCH_CHECK_VALUE(t.isTensor() && t.toTensor().scalar_type() == torch::kUInt8 && t.toTensor().numel() > 0, source,
                      " rng holds ", t.isTensor() ? "an empty or non-byte tensor" : "a " + std::string(t.tagKind()),
                      ", not a generator state (torch.get_rng_state()'s bytes)");
    c.rng.push_back(t.toTensor());
  }
  return c;
}

}  // namespace

void read_position_and_run(const GenericDict& top, const std::string& source, Checkpoint& c) {
  const GenericDict position = as_dict(entry(top, "position", source), source + " position");
  // Each field is checked as it is read, naming the file and the field: a forged or damaged
  // checkpoint (a negative step, a string) is refused here, not deep in a scheduler or an assert.
  const auto count = [&](const char* key) {
    const IValue v = entry(position, key, source);
    TORCH_CHECK_VALUE(v.isInt(), source, " position.", key, " is a ", v.tagKind(), ", not an integer");
    TORCH_CHECK_VALUE(v.toInt() >= 0, source, " position.", key, " is ", v.toInt(), "; it counts, so it is at least 0");
    return v.toInt();
  };
  c.position.epoch = count("epoch");
  c.position.micro_batch = count("micro_batch");
  c.position.step = count("step");
  c.position.skipped_steps = count("skipped_steps");
  c.position.consecutive_skips = count("consecutive_skips");
  const IValue loss_sum = entry(position, "epoch_loss_sum", source);
  TORCH_CHECK_VALUE(loss_sum.isDouble() && std::isfinite(loss_sum.toDouble()), source, " position.epoch_loss_sum is ",
                    loss_sum.isDouble() ? std::to_string(loss_sum.toDouble()) : "a " + std::string(loss_sum.tagKind()),
                    ", not a finite number");
  c.position.epoch_loss_sum = loss_sum.toDouble();
  c.position.epoch_steps = count("epoch_steps");
  const TrainingPosition& p = c.position;
  TORCH_CHECK_VALUE(p.skipped_steps <= p.step && p.consecutive_skips <= p.skipped_steps, source, " position counts ",
                    p.skipped_steps, " skipped steps (", p.consecutive_skips, " in a row) of ", p.step,
                    ": more than it took");
  for (const auto& item : as_dict(entry(top, "run", source), source + " run"))
    c.run.insert(item.key().toStringRef(), item.value());
}

GenericDict position_and_run(const Checkpoint& c) {
  GenericDict position = string_dict();
  position.insert("epoch", c.position.epoch);
  position.insert("micro_batch", c.position.micro_batch);
  position.insert("step", c.position.step);
  position.insert("skipped_steps", c.position.skipped_steps);
  position.insert("consecutive_skips", c.position.consecutive_skips);
  position.insert("epoch_loss_sum", c.position.epoch_loss_sum);
  position.insert("epoch_steps", c.position.epoch_steps);
  GenericDict top = string_dict();
  top.insert("position", position);
  top.insert("run", c.run);
  return top;
}

const std::vector<std::string>& checkpoint_format_names() {
  static const std::vector<std::string> names{"full", "sharded"};
  return names;
}

GenericDict string_dict() { return GenericDict(c10::StringType::get(), c10::AnyType::get()); }

void save_checkpoint(const Checkpoint& c, const std::string& path) {
  c10::List<torch::Tensor> rng;
  for (const auto& t : c.rng) rng.push_back(t);

  GenericDict top = string_dict();
  top.insert("format", std::string(kFormat));
  for (const auto& item : position_and_run(c)) top.insert(item.key(), item.value());
  top.insert("model", c.model);
  top.insert("optimizer", c.optimizer);
  top.insert("scaler", c.scaler);
  top.insert("rng", rng);
  write_file_atomic(path, torch_save(top));
}

Checkpoint load_checkpoint(const std::string& path) {
  if (is_sharded_checkpoint(path)) return load_sharded_checkpoint(path);
  const std::string source = "checkpoint '" + path + "'";
  IValue top_value;
  const std::vector<char> bytes = read_file(path);  // names the path itself
  try {
    top_value = torch_load(bytes);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "cannot read ", source, " (corrupt or not a checkpoint): ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cannot read ", source, " (corrupt or not a checkpoint): ", e.what());
  }
  // Entries of the wrong type (a damaged file that still unpickles) fail in LibTorch's IValue
  // accessors, whose messages do not say which file: add it.
  try {
    return parse_checkpoint(top_value, source);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    if (what.find(source) != std::string::npos) throw;
    TORCH_CHECK(false, source, " is corrupt or not a lockstep checkpoint: ", what);
  }
}

void check_same_run(const Checkpoint& c, const GenericDict& run, const std::string& path) {
  std::string differences;
  for (const auto& item : run) {
    const std::string& key = item.key().toStringRef();
    // See Note [Resuming on another world size].
    if (key == "world_size" || key == "replicas" || key == "batch_size" || key == "accum_steps") continue;
    auto it = c.run.find(key);
    std::ostringstream d;
    if (it == c.run.end()) {
      d << key << " (absent from the checkpoint; this run has " << item.value() << ")";
    } else if (it->value() != item.value()) {
      d << key << "=" << it->value() << " in the checkpoint but " << item.value() << " in this run";
    } else {
      continue;
    }
    differences += (differences.empty() ? "" : "; ") + d.str();
  }
  TORCH_CHECK_VALUE(differences.empty(), "cannot resume from '", path, "': it was written by a different run: ",
                    differences, ". Resume with the same settings, or start afresh from its model weights with ",
                    "--init-weights '", path, "' in place of --resume, and an empty --checkpoint-dir");
}

// See Note [Resuming on another world size].
std::string adapt_position(TrainingPosition& position, const GenericDict& written, const GenericDict& run,
                           const std::string& path) {
  auto setting = [&](const GenericDict& settings, const char* key, const char* where) {
    auto it = settings.find(key);
    TORCH_CHECK(it != settings.end() && it->value().isInt(), where, " has no integer '", key, "' setting");
    return it->value().toInt();
  };
  // A run that records no data layout (a library user's own settings) has nothing to adapt.
  if (run.find("world_size") == run.end() || run.find("batch_size") == run.end()) return "";
  const std::string source = "checkpoint '" + path + "'";
  // Data-parallel replicas: ranks, or a pipeline's stages together (recorded since issue 29; before, every rank was one).
  const auto replicas = [&](const GenericDict& settings, const char* where) {
    return setting(settings, settings.find("replicas") != settings.end() ? "replicas" : "world_size", where);
  };
  const int64_t world = replicas(written, source.c_str()), batch = setting(written, "batch_size", source.c_str());
  const int64_t new_world = replicas(run, "this run"), new_batch = setting(run, "batch_size", "this run");
  const int64_t accum = setting(run, "accum_steps", "this run");
  const int64_t written_accum = written.find("accum_steps") != written.end() ? setting(written, "accum_steps", source.c_str())
                                                                          : accum;
  if (world == new_world && batch == new_batch && written_accum == accum) return "";
  const int64_t consumed = position.micro_batch * batch * world;  // samples of the epoch, all replicas
  const int64_t per_step = new_batch * new_world * accum;
  position.micro_batch = consumed / per_step * accum;
  const int64_t repeated = consumed - position.micro_batch * new_batch * new_world;
  std::ostringstream notice;
  const auto micro_batches = [](int64_t k) { return k > 1 ? " x " + std::to_string(k) + " micro-batches" : std::string(); };
  notice << source << " was written by " << world << " data-parallel replica(s) of batch " << batch
         << micro_batches(written_accum) << " (" << world * batch * written_accum << " samples per step); this run has "
         << new_world << " of batch " << new_batch << micro_batches(accum) << " (" << per_step << "). ";
  if (world * batch * written_accum == per_step) {
    notice << "The global batch is the same, so every later step holds the samples it held in the original run "
              "(BatchNorm's running statistics, kept per replica without sync_batchnorm, follow this run's "
              "per-replica batches: they will not equal the original run's)";
  } else {
    notice << "The data order differs from here on: steps hold a different number of samples, the learning-rate "
              "schedule counts these steps, and the run does not reproduce the original one";
  }
  if (repeated > 0) notice << "; " << repeated << " samples of this epoch are seen a second time (resuming at a step boundary)";
  return notice.str();
}

std::string checkpoint_path(const std::string& dir, int64_t step) {
  char name[40];
  std::snprintf(name, sizeof(name), "%s%08lld%s", kPrefix, static_cast<long long>(step), kSuffix);
  return (fs::path(dir) / name).string();
}

std::string sharded_checkpoint_path(const std::string& dir, int64_t step) {
  const std::string file = checkpoint_path(dir, step);
  return file.substr(0, file.size() - std::string(kSuffix).size());
}

bool is_sharded_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return false;
  fs::path p(path);
  if (!p.has_filename()) p = p.parent_path();  // "DIR/step-00000004/"
  return step_of(p.filename().string(), /*directory=*/true) >= 0 || fs::exists(p / kShardedMetadataFile, ec);
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const int64_t file_step = e.is_regular_file(ec) ? step_of(name) : -1;
    const int64_t dir_step = e.is_directory(ec) ? step_of(name, /*directory=*/true) : -1;
    if (file_step >= 0) found.emplace_back(file_step, e.path().string());
    if (dir_step >= 0) found.emplace_back(dir_step, e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& f : found) paths.push_back(std::move(f.second));
  return paths;
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  auto all = list_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

void remove_old_checkpoints(const std::string& dir, int64_t keep_last) {
  if (keep_last <= 0) return;
  auto all = list_checkpoints(dir);
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i) {
    std::error_code ec;
    fs::remove_all(all[i], ec);  // a checkpoint that cannot be removed costs disk space, nothing else
  }
}

}  // namespace lockstep::train
