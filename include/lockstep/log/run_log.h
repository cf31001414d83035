#pragma once

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <string>

#include "lockstep/core/report.h"
#include "lockstep/launch/unique_fd.h"
#include "lockstep/log/tensorboard.h"

namespace lockstep::log {

struct RunLogOptions {
  TORCH_ARG(std::string, jsonl) = "";        // one JSON object per line; "": none
  TORCH_ARG(bool, append) = false;           // continue the file (a resumed run) instead of truncating it
  TORCH_ARG(std::string, tensorboard) = "";  // event files in this directory; "": none
  TORCH_ARG(Reporter, reporter) = stdio_reporter();  // a log that stops says so here (Note [Reports])
};

// A run's record on rank 0: events as JSON lines and scalars for TensorBoard. Other ranks make an
// empty RunLog (default options), on which every call does nothing. A failed write (a full disk)
// stops that log with one error message rather than the run; the JSON lines file then ends with
// its last complete line, never half of one.
class RunLog {
 public:
  RunLog() = default;
  explicit RunLog(const RunLogOptions& options);  // throws naming a file it cannot open

  void event(const nlohmann::ordered_json& j);
  void scalar(const std::string& tag, double value, int64_t step);
  // Flushes and closes the TensorBoard writer (the JSON lines are flushed line by line).
  void close();

 private:
  void stop_tensorboard(const c10::Error& e);
  void stop_jsonl(const char* why);

  std::string jsonl_path_;
  Reporter reporter_;
  launch::UniqueFd jsonl_;
  std::unique_ptr<SummaryWriter> tensorboard_;
};

}  // namespace lockstep::log
