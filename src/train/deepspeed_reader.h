#pragma once
// Internal to src/train: the reader behind with_deepspeed_config (deepspeed_config.cpp for the
// batch, ZeRO, precision and the rest; deepspeed_optimizer.cpp for the optimizer and scheduler).

#include <c10/util/Exception.h>
#include <c10/util/Optional.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lockstep/train/deepspeed_config.h"

namespace lockstep::train::deepspeed {

using nlohmann::json;

// Where each key of a config file sits, "optimizer.params.lr" -> its line (1-based). Empty for a
// config that did not come from a file.
using KeyLines = std::map<std::string, int64_t>;

// The JSON text of the config file `path`, its keys' lines in `lines`. Refuses a key given twice in
// one object (DeepSpeed refuses it), a number beyond a double and nesting past 100 levels, naming
// the file, the key and the line (deepspeed_json.cpp).
json parse_config_file(const std::string& path, std::string text, KeyLines& lines);

// "ds.json, line 3" where the key's line is known, else "ds.json".
std::string where(const std::string& source, const KeyLines& lines, const std::string& key);

// A known section or value of the wrong type is an error, strict or not (deepspeed_json.cpp).
void check_shapes(const json& config, const std::string& source, const KeyLines& lines);

inline bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

inline std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// A section that is present but switched off ({"enabled": false}) asks for nothing.
inline bool disabled(const json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
         (v.is_object() && v.contains("enabled") && v["enabled"].is_boolean() && !v["enabled"].get<bool>());
}

class Reader {
 public:
  Reader(TrainOptions& o, std::string source, const DeepSpeedConfigOptions& how)
      : o_(o), source_(std::move(source)), how_(how) {}

  // The number at `parent[key]`; nullopt when missing or "auto". `path` names it in errors.
  c10::optional<double> number(const json& parent, const char* key, const std::string& path) const {
    if (!parent.is_object() || !parent.contains(key) || is_auto(parent[key]) || parent[key].is_null())
      return c10::nullopt;
    const json& v = parent[key];
    TORCH_CHECK_VALUE(v.is_number(), source_, ": ", path, " is ", v.dump(), "; give a number or \"auto\"");
    return v.get<double>();
  }
  c10::optional<int64_t> count(const json& parent, const char* key, const std::string& path) const {
    const c10::optional<double> v = number(parent, key, path);
    if (!v) return c10::nullopt;
    // Compared as doubles before the cast: a double past int64's range cast to it is undefined
    // (the deepspeed_config fuzz target's 2.56e29 train_batch_size).
    TORCH_CHECK_VALUE(*v >= 1 && *v < 9223372036854775808.0 && *v == std::floor(*v), source_, ": ", path, " is ", *v,
                      "; give a whole number of at least 1 and below 2^63");
    return static_cast<int64_t>(*v);
  }
  // `enabled` of a section such as bf16: nullopt when the section or its value is missing or "auto".
  c10::optional<bool> enabled(const json& config, const char* section) const {
    if (!config.contains(section) || !config[section].is_object() || !config[section].contains("enabled"))
      return c10::nullopt;
    const json& v = config[section]["enabled"];
    if (is_auto(v)) return c10::nullopt;
    TORCH_CHECK_VALUE(v.is_boolean(), source_, ": ", section, ".enabled is ", v.dump(), "; give true, false or \"auto\"");
    return v.get<bool>();
  }

  // A value from the file against the same one set explicitly on the command line.
  template <typename T>
  void agree(bool given, const T& command_line, const T& config, const std::string& key, const char* option) const {
    TORCH_CHECK_VALUE(!given || command_line == config, source_, ": ", key, " is ", config, " but ", option, " ",
                      command_line, " was given explicitly; drop one of them, make them equal, or set ", key,
                      " to \"auto\" to take the command line's");
  }

  void unsupported(const std::string& key, const std::string& why) { unsupported_.push_back(key + ": " + why); }

  void read_batch(const json& c);
  void read_zero(const json& z);
  void read_precision(const json& c);
  void read_optimizer(const json& opt);
  void read_optimizer_params(const json& params, optim::OptimizerKind kind);
  void read_scheduler(const json& s);
  void read_other(const std::string& key, const json& value);
  void finish() const;

 private:
  TrainOptions& o_;
  std::string source_;
  const DeepSpeedConfigOptions& how_;
  std::vector<std::string> unsupported_;  // "key: why"
};

}  // namespace lockstep::train::deepspeed
