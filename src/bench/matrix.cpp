#include "lockstep/bench/matrix.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>

#include "../core/yaml_error.h"

namespace lockstep::bench {

std::vector<BenchConfig> default_matrix(int64_t cores) {
  const int64_t n = std::max<int64_t>(2, cores);  // dp and ddp need two replicas to mean anything
  const std::string replicas = std::to_string(n);
  auto local = [&](std::string key, std::string name, std::vector<std::string> args, std::string note = "") {
    BenchConfig c;
    c.key = std::move(key), c.name = std::move(name), c.threads = cores, c.args = std::move(args);
    c.note = std::move(note);
    return c;
  };
  auto ddp = [&](std::string key, std::string name, std::vector<std::string> args, std::string note = "") {
    BenchConfig c;
    c.key = std::move(key), c.name = std::move(name), c.world_size = n, c.threads = 1, c.args = std::move(args);
    c.note = std::move(note);
    return c;
  };
  std::vector<BenchConfig> m;
  m.push_back(local("fp32", "local fp32", {}, "the baseline: one process, every core, fp32"));
  m.push_back(local("bf16-o1", "local bf16 O1", {"--precision", "bf16", "--opt-level", "O1"},
                    "autocast: bf16 matrix products, fp32 weights; no loss scaling (bf16 has fp32's range)"));
  m.push_back(local("bf16-o2", "local bf16 O2", {"--precision", "bf16", "--opt-level", "O2"},
                    "bf16 model, fp32 master weights (counted as optimizer state) and fp32 BatchNorm"));
  m.push_back(local("bf16-o3", "local pure bf16 O3", {"--precision", "bf16", "--opt-level", "O3"},
                    "pure half: bf16 weights without fp32 masters; updates smaller than bf16's 8-bit mantissa "
                    "resolves round away, so accuracy may trail fp32's (the write-up's pure fp16 lost 10 points)"));
  BenchConfig dp = local("dp", "dp (DataParallel)", {"--strategy", "dp", "--replicas", replicas},
                         "one process, " + replicas + " replicas on threads of " +
                             std::to_string(std::max<int64_t>(1, cores / n)) +
                             " intra-op thread(s) each; outputs gathered and gradients summed in-process");
  m.push_back(dp);
  BenchConfig plain = ddp("ddp", "ddp", {}, "one process per core, one thread each; gradients all-reduced over Gloo");
  plain.peer = true;
  m.push_back(plain);
  BenchConfig bf16 = ddp("ddp-bf16", "ddp + bf16 O1", {"--precision", "bf16"});
  bf16.peer = true, bf16.peer_args = {"--amp"};
  m.push_back(bf16);
  BenchConfig accum = ddp("ddp-accum", "ddp + accumulation x2", {}, "two micro-batches of half the batch per step: "
                          "the same step, half the activation memory");
  accum.accum_steps = 2;
  m.push_back(accum);
  m.push_back(ddp("ddp-syncbn", "ddp + SyncBN", {"--sync-bn"},
                  "BatchNorm statistics over the global batch: two small all-reduces per BatchNorm layer (the "
                  "statistics in forward, two gradient sums in backward)"));
  m.push_back(ddp("zero1", "zero1", {"--strategy", "zero1"},
                  "ZeRO stage 1: each rank keeps the optimizer state of its shard; gradients all-reduced, "
                  "updated shards all-gathered"));
  m.push_back(ddp("zero2", "zero2", {"--strategy", "zero2"},
                  "ZeRO stage 2: gradients reduce-scattered too, so each rank keeps only its shard's gradients"));
  m.push_back(ddp("fsdp", "fsdp", {"--strategy", "fsdp"},
                  "parameters, gradients and optimizer state sharded per block; each block all-gathered for its "
                  "forward and again for its backward, gradients reduce-scattered: 3/2 of ddp's bytes"));
  m.push_back(ddp("ddp-imagefolder", "ddp from PNG files",
                  {"--data", "imagefolder", "--data-dir", std::string(kImageFolder) + "/train", "--val-dir",
                   std::string(kImageFolder) + "/test", "--transform",
                   "Grayscale(), ToTensor(), Normalize((0.2860,), (0.3530,))", "--workers", "1"},
                  "the ddp row's images as 28x28 grey PNG files, decoded and normalised by one loader thread per "
                  "rank while the step runs; the ddp row holds them decoded in memory"));
  return m;
}

namespace {

// "FILE:LINE" of a YAML node, for errors (yaml-cpp counts lines from 0).
std::string where(const std::string& path, const YAML::Node& node) {
  return path + ":" + std::to_string(node.Mark().line + 1);
}

template <typename T>
T scalar(const std::string& path, const YAML::Node& node, const std::string& field) {
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    TORCH_CHECK_VALUE(false, where(path, node), ": '", field, "' must be ",
                      std::is_same_v<T, bool> ? "true or false" : std::is_integral_v<T> ? "an integer" : "a string",
                      ", got '", YAML::Dump(node), "'");
  }
}

std::vector<std::string> strings(const std::string& path, const YAML::Node& node, const std::string& field) {
  TORCH_CHECK_VALUE(node.IsSequence(), where(path, node), ": '", field, "' must be a list, as [--precision, bf16]");
  std::vector<std::string> out;
  for (const YAML::Node& item : node) out.push_back(scalar<std::string>(path, item, field));
  return out;
}

std::string field_name(const std::string& path, const YAML::Node& key) {
  TORCH_CHECK_VALUE(key.IsScalar(), where(path, key), ": a field's name must be a word, got '", YAML::Dump(key), "'");
  return key.Scalar();
}

BenchConfig read_config(const std::string& path, const YAML::Node& node, int64_t cores) {
  TORCH_CHECK_VALUE(node.IsMap(), where(path, node), ": a configuration must be a mapping with at least 'key'");
  TORCH_CHECK_VALUE(node["key"], where(path, node), ": a configuration without 'key' (the name --only selects)");
  BenchConfig c;
  c.key = scalar<std::string>(path, node["key"], "key");
  // A key names the row's files in --out: a name, never a path.
  const bool plain = !c.key.empty() && c.key != "." && c.key != ".." &&
                     c.key.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") ==
                         std::string::npos;
  TORCH_CHECK_VALUE(plain, where(path, node["key"]), ": key '", c.key, "' must be a plain name of letters, digits, ",
                    "'.', '_' and '-' (it names the row's files in --out, and --only separates keys with commas)");
  c.name = c.key;
  bool threads_set = false;
  for (const auto& field : node) {
    const std::string name = field_name(path, field.first);
    const YAML::Node& v = field.second;
    if (name == "key") continue;
    if (name == "name") c.name = scalar<std::string>(path, v, name);
    else if (name == "world_size") c.world_size = scalar<int64_t>(path, v, name);
    else if (name == "threads") c.threads = scalar<int64_t>(path, v, name), threads_set = true;
    else if (name == "accum_steps") c.accum_steps = scalar<int64_t>(path, v, name);
    else if (name == "args") c.args = strings(path, v, name);
    else if (name == "peer") c.peer = scalar<bool>(path, v, name);
    else if (name == "peer_args") c.peer_args = strings(path, v, name);
    else if (name == "note") c.note = scalar<std::string>(path, v, name);
    else
      TORCH_CHECK_VALUE(false, where(path, field.first), ": unknown field '", name, "' in configuration '", c.key,
                        "'; fields are key, name, world_size, threads, accum_steps, args, peer, peer_args, note");
  }
  TORCH_CHECK_VALUE(c.world_size >= 1, where(path, node), ": '", c.key, "': world_size ", c.world_size, " must be >= 1");
  TORCH_CHECK_VALUE(c.accum_steps >= 1, where(path, node), ": '", c.key, "': accum_steps ", c.accum_steps,
                    " must be >= 1");
  if (!threads_set) c.threads = std::max<int64_t>(1, cores / c.world_size);  // every core once, as the built-in rows
  TORCH_CHECK_VALUE(c.threads >= 1, where(path, node), ": '", c.key, "': threads ", c.threads, " must be >= 1");
  return c;
}

}  // namespace

std::vector<BenchConfig> read_matrix(const std::string& path, int64_t cores) {
  TORCH_CHECK_VALUE(std::filesystem::is_regular_file(path), "--matrix: no such file '", path, "'");
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    TORCH_CHECK_VALUE(false, "--matrix: ", path, ":", e.mark.line + 1, ": ", yaml_error_text(e));
  }
  const YAML::Node list = root.IsMap() ? root["configurations"] : root;
  TORCH_CHECK_VALUE(list && list.IsSequence() && list.size() > 0, "--matrix: ", path,
                    " must hold a non-empty list of configurations (at the top or under 'configurations:')");
  std::vector<BenchConfig> matrix;
  try {
    if (root.IsMap())
      for (const auto& field : root)
        TORCH_CHECK_VALUE(field_name(path, field.first) == "configurations", "--matrix: ", where(path, field.first),
                          ": unknown field '", field.first.Scalar(), "'; the file holds 'configurations:'");
    std::set<std::string> keys;
    for (const YAML::Node& node : list) {
      matrix.push_back(read_config(path, node, cores));
      TORCH_CHECK_VALUE(keys.insert(matrix.back().key).second, "--matrix: ", where(path, node), ": key '",
                        matrix.back().key, "' appears twice; keys name rows and must be unique");
    }
  } catch (const YAML::Exception& e) {  // what the checks above do not foresee still names the file
    TORCH_CHECK_VALUE(false, "--matrix: ", path, ":", e.mark.line + 1, ": ", yaml_error_text(e));
  }
  return matrix;
}

std::vector<BenchConfig> select(const std::vector<BenchConfig>& matrix, const std::string& only) {
  if (only.empty()) return matrix;
  std::vector<std::string> keys, known;
  for (const BenchConfig& c : matrix) known.push_back(c.key);
  std::stringstream in(only);
  for (std::string key; std::getline(in, key, ',');) {
    if (key.empty()) continue;
    TORCH_CHECK_VALUE(std::find(known.begin(), known.end(), key) != known.end(), "--only: unknown configuration '", key,
                      "'; choose from ", c10::Join(", ", known));
    keys.push_back(key);
  }
  std::vector<BenchConfig> out;
  for (const BenchConfig& c : matrix)
    if (std::find(keys.begin(), keys.end(), c.key) != keys.end()) out.push_back(c);
  TORCH_CHECK_VALUE(!out.empty(), "--only '", only, "' names no configuration; choose from ", c10::Join(", ", known));
  return out;
}

}  // namespace lockstep::bench
