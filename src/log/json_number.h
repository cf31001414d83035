#pragma once
// Reading numbers back from the JSON lines lockstep writes (run logs, bench results).

#include <nlohmann/json.hpp>

#include <cmath>

namespace lockstep::log {

// `key` of `j`: `missing` when absent, NaN when present but not a number (null: a NaN the writer
// could not express).
inline double json_number(const nlohmann::ordered_json& j, const char* key, double missing = NAN) {
  const auto it = j.find(key);
  if (it == j.end()) return missing;
  return it->is_number() ? it->get<double>() : NAN;
}

}  // namespace lockstep::log
