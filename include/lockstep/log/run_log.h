#pragma once

#include <nlohmann/json.hpp>
#include <torch/arg.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "lockstep/log/tensorboard.h"

namespace lockstep::log {

struct RunLogOptions {
  TORCH_ARG(std::string, jsonl) = "";        // one JSON object per line; "": none
  TORCH_ARG(bool, append) = false;           // continue the file (a resumed run) instead of truncating it
  TORCH_ARG(std::string, tensorboard) = "";  // event files in this directory; "": none
};

// A run's record on rank 0: events as JSON lines and scalars for TensorBoard. Other ranks make an
// empty RunLog (default options), on which every call does nothing. A failed TensorBoard write (a
// full disk) stops TensorBoard logging with one error message rather than the run.
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

  std::ofstream jsonl_;
  std::unique_ptr<SummaryWriter> tensorboard_;
};

}  // namespace lockstep::log
