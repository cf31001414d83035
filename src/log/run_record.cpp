#include "lockstep/log/run_record.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <map>

#include "lockstep/core/line_reader.h"

namespace lockstep::log {
namespace {

double json_number(const nlohmann::ordered_json& j, const char* key, double missing = 0.0) {
  const auto it = j.find(key);
  if (it == j.end()) return missing;
  return it->is_number() ? it->get<double>() : NAN;  // null: a NaN the writer could not express
}

// 0 when absent, not a number, or a number no int64 holds.
int64_t integer(const nlohmann::ordered_json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  const double v = it->get<double>();
  return std::isfinite(v) && std::abs(v) < 9.2e18 ? static_cast<int64_t>(v) : 0;
}

std::string string_field(const nlohmann::ordered_json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

RunRecord read_run_log(const std::string& path) {
  LineReader in(path, kMaxRunLogLineBytes, "the run log", "; pass the file `lockstep train --log-jsonl FILE` wrote");
  RunRecord r;
  std::map<int64_t, StepRecord> steps;
  std::map<int64_t, EpochRecord> epochs;
  std::map<int64_t, SkipRecord> skips;
  int64_t runs = 0;
  for (std::string line; in.next(line);) {
    const int64_t line_number = in.line_number();
    TORCH_CHECK(!in.too_long(), "the run log '", path, "' line ", line_number, " is longer than ", kMaxRunLogLineBytes,
                " bytes: a --log-jsonl line holds one event of a few hundred bytes; is it a run log?");
    if (line.empty()) continue;
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    TORCH_CHECK(j.is_object(), "the run log '", path, "' line ", line_number,
                " is not a JSON object: a --log-jsonl file holds one per line");
    const std::string event = string_field(j, "event");
    if (event == "step") {
      StepRecord s;
      s.step = integer(j, "step");
      s.epoch = integer(j, "epoch");
      s.loss = json_number(j, "loss", NAN);
      s.lr = json_number(j, "lr");
      s.samples_per_s = json_number(j, "samples_per_s");
      s.loss_scale = json_number(j, "loss_scale");
      s.skipped_steps = integer(j, "skipped_steps");
      steps[s.step] = s;
    } else if (event == "epoch") {
      EpochRecord e;
      e.epoch = integer(j, "epoch");
      e.step = integer(j, "step");
      e.train_loss = json_number(j, "train_loss", NAN);
      e.test_acc = json_number(j, "test_acc", NAN);
      e.train_s = json_number(j, "train_s");
      epochs[e.epoch] = e;
    } else if (event == "skipped_step") {
      skips[integer(j, "step")] = {integer(j, "step"), string_field(j, "reason")};
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
