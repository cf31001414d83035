#include "lockstep/log/run_log.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace lockstep::log {

RunLog::RunLog(const RunLogOptions& options) {
  if (!options.jsonl().empty()) {
    jsonl_.open(options.jsonl(), options.append() ? std::ios::app : std::ios::trunc);
    TORCH_CHECK(jsonl_, "cannot open --log-jsonl file '", options.jsonl(), "': ", std::strerror(errno));
  }
  if (!options.tensorboard().empty()) tensorboard_ = std::make_unique<SummaryWriter>(options.tensorboard());
}

void RunLog::event(const nlohmann::ordered_json& j) {
  if (jsonl_.is_open()) jsonl_ << j.dump() << '\n' << std::flush;
}

void RunLog::scalar(const std::string& tag, double value, int64_t step) {
  if (!tensorboard_) return;
  try {
    tensorboard_->add_scalar(tag, value, step);
  } catch (const c10::Error& e) {
    stop_tensorboard(e);
  }
}

void RunLog::close() {
  if (!tensorboard_) return;
  try {
    tensorboard_->close();
  } catch (const c10::Error& e) {
    stop_tensorboard(e);
  }
  tensorboard_.reset();
}

void RunLog::stop_tensorboard(const c10::Error& e) {
  std::fprintf(stderr, "lockstep: error: TensorBoard logging stopped: %s\n", e.what_without_backtrace());
  tensorboard_.reset();
}

}  // namespace lockstep::log
