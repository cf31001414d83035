#include "lockstep/log/run_log.h"

#include <c10/util/StringUtil.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace lockstep::log {

namespace {

// Length of `fd`'s contents up to and including its last newline: what remains of a file whose
// last line was cut short (a run killed mid-write, or by a full disk before this check existed).
off_t complete_lines_length(int fd) {
  const off_t size = ::lseek(fd, 0, SEEK_END);
  char buffer[4096];
  for (off_t end = size; end > 0;) {
    const off_t begin = std::max<off_t>(0, end - static_cast<off_t>(sizeof(buffer)));
    const ssize_t n = ::pread(fd, buffer, static_cast<size_t>(end - begin), begin);
    if (n <= 0) return size;  // unreadable: leave the file as it is
    for (ssize_t i = n - 1; i >= 0; --i)
      if (buffer[i] == '\n') return begin + i + 1;
    end = begin;
  }
  return 0;
}

}  // namespace

RunLog::RunLog(const RunLogOptions& options) : jsonl_path_(options.jsonl()), reporter_(options.reporter()) {
  if (!options.jsonl().empty()) {
    const int flags = O_RDWR | O_CREAT | O_CLOEXEC | (options.append() ? 0 : O_TRUNC);
    jsonl_ = launch::UniqueFd(::open(options.jsonl().c_str(), flags, 0644));
    TORCH_CHECK(jsonl_.valid(), "cannot open --log-jsonl file '", options.jsonl(), "': ", std::strerror(errno));
    const off_t size = ::lseek(jsonl_.get(), 0, SEEK_END), complete = complete_lines_length(jsonl_.get());
    if (complete < size) {
      report(reporter_, ReportKind::kWarning, c10::str("--log-jsonl '", options.jsonl(), "' ended in a cut-off line (",
                                                       size - complete, " bytes); removed it before appending"));
      TORCH_CHECK(::ftruncate(jsonl_.get(), complete) == 0, "cannot remove the cut-off last line of --log-jsonl '",
                  options.jsonl(), "': ", std::strerror(errno));
    }
  }
  if (!options.tensorboard().empty()) tensorboard_ = std::make_unique<SummaryWriter>(options.tensorboard());
}

void RunLog::event(const nlohmann::ordered_json& j) {
  if (!jsonl_.valid()) return;
  const std::string line = j.dump() + '\n';
  const off_t start = ::lseek(jsonl_.get(), 0, SEEK_END);
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(jsonl_.get(), line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const char* why = std::strerror(n < 0 ? errno : EIO);
      // Should even this fail, the next resumed run's open removes the half line (complete_lines_length).
      (void)!::ftruncate(jsonl_.get(), start);
      stop_jsonl(why);
      return;
    }
    done += static_cast<size_t>(n);
  }
}

void RunLog::stop_jsonl(const char* why) {
  report(reporter_, ReportKind::kError, c10::str("--log-jsonl logging stopped: writing to '", jsonl_path_, "' failed: ",
                                                 why, "; the file ends with the last complete line"));
  jsonl_.reset();
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
  report(reporter_, ReportKind::kError, c10::str("TensorBoard logging stopped: ", e.what_without_backtrace()));
  tensorboard_.reset();
}

}  // namespace lockstep::log
