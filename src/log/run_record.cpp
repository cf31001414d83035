#include "lockstep/log/run_record.h"

#include <c10/util/Exception.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

namespace lockstep::log {
namespace {

double number(const nlohmann::ordered_json& j, const char* key, double missing = 0.0) {
  const auto it = j.find(key);
  if (it == j.end()) return missing;
  return it->is_number() ? it->get<double>() : NAN;  // null: a NaN the writer could not express
}

int64_t integer(const nlohmann::ordered_json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<int64_t>() : 0;
}

}  // namespace

RunRecord read_run_log(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK(in, "cannot read the run log '", path, "': ", std::strerror(errno),
              "; pass the file `lockstep train --log-jsonl FILE` wrote");
  RunRecord r;
  std::map<int64_t, StepRecord> steps;
  std::map<int64_t, EpochRecord> epochs;
  std::map<int64_t, SkipRecord> skips;
  int64_t runs = 0;
  int64_t line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.empty()) continue;
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    TORCH_CHECK(j.is_object(), "the run log '", path, "' line ", line_number,
                " is not a JSON object: a --log-jsonl file holds one per line");
    const std::string event = j.value("event", "");
    if (event == "step") {
      StepRecord s;
      s.step = integer(j, "step");
      s.epoch = integer(j, "epoch");
      s.loss = number(j, "loss", NAN);
      s.lr = number(j, "lr");
      s.samples_per_s = number(j, "samples_per_s");
      s.loss_scale = number(j, "loss_scale");
      s.skipped_steps = integer(j, "skipped_steps");
      steps[s.step] = s;
    } else if (event == "epoch") {
      EpochRecord e;
      e.epoch = integer(j, "epoch");
      e.step = integer(j, "step");
      e.train_loss = number(j, "train_loss", NAN);
      e.test_acc = number(j, "test_acc", NAN);
      e.train_s = number(j, "train_s");
      epochs[e.epoch] = e;
    } else if (event == "skipped_step") {
      skips[integer(j, "step")] = {integer(j, "step"), j.value("reason", "")};
    } else if (event == "run") {
      ++runs;
      r.settings = j.value("settings", nlohmann::ordered_json());
    } else if (event == "summary") {
      r.summary = j;
    }
  }
  TORCH_CHECK(!steps.empty() || !epochs.empty() || !r.summary.is_null(), "the run log '", path,
              "' holds no step, epoch or summary line: is it a `lockstep train --log-jsonl` file?");
  r.resumes = runs > 0 ? runs - 1 : 0;
  for (auto& [step, s] : steps) r.steps.push_back(s);
  for (auto& [epoch, e] : epochs) r.epochs.push_back(e);
  for (auto& [step, s] : skips) r.skips.push_back(s);
  return r;
}

}  // namespace lockstep::log
