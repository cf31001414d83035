#pragma once
// One small training run started by different engines (lockstep run, mpirun, a PyTorchJob's
// environment), and the losses its JSONL log recorded, to compare them.

#include <nlohmann/json.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "../test_util.h"

namespace lockstep::testing {

// `lockstep train` words for a run of a few seconds on 2 ranks: 400 synthetic samples, 20 per rank
// and step (10 steps), each step logged, one intra-op thread so that every engine computes the same.
inline std::vector<std::string> small_train_args(const std::string& jsonl) {
  return {LOCKSTEP_CLI, "train", "--quiet", "--model", "mlp", "--data", "synthetic", "--limit", "400",
          "--batch-size", "20", "--seed", "7", "--threads", "1", "--log-every", "1", "--log-jsonl", jsonl};
}

inline std::string shell_words(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

// The "loss" of each "step" line of a run's JSONL log, in order.
inline std::vector<double> step_losses(const std::string& jsonl_path) {
  std::vector<double> losses;
  std::istringstream in(read_text(jsonl_path));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("event", "") == "step") losses.push_back(j.at("loss").get<double>());
  }
  return losses;
}

// The losses of the small run under `lockstep run --nproc-per-node 2` (its log written in `dir`):
// what every other engine's run of it is compared with.
inline std::vector<double> lockstep_run_losses(const TempDir& dir) {
  const auto r = run_command(std::string(LOCKSTEP_CLI) + " run --nproc-per-node 2 -- " +
                             shell_words(small_train_args(dir / "run.jsonl")));
  if (r.exit_code != 0) return {};
  return step_losses(dir / "run.jsonl");
}

}  // namespace lockstep::testing
