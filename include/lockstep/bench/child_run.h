#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace lockstep::bench {

// Runs argv with `env` added to this process's environment, stdout and stderr into `log_path`, in
// a process group of its own; returns its exit code (128 + signal when killed by one), or nullopt
// when it ran longer than `timeout_s` (then it and its process group are killed).
std::optional<int> run_child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                             const std::string& log_path, double timeout_s);

// The last JSON object with a "samples_per_s" key a run printed (lockstep's summary, maybe behind
// "[rank 0] "; the peer's); null when there is none.
nlohmann::json last_json(const std::string& log_path);

// Why a run failed, for a table: "exit N: " and its last line holding "error" (else its last
// line), or that it was killed after `timeout_s`.
std::string failure(const std::string& log_path, const std::optional<int>& code, double timeout_s);

// The machine and the moment, for a results file: /proc/cpuinfo's model name, ISO 8601 UTC now.
std::string cpu_model();
std::string utc_now();

}  // namespace lockstep::bench
