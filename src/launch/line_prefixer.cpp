#include "lockstep/launch/line_prefixer.h"

#include <unistd.h>

#include <cerrno>

namespace lockstep::launch {

LinePrefixer::LinePrefixer(std::string prefix, int out_fd, size_t tail_lines)
    : prefix_(std::move(prefix)), out_fd_(out_fd), tail_lines_(tail_lines) {}

// See Note [Long worker lines].
void LinePrefixer::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    const std::string_view piece = bytes.substr(0, newline);
    if (!cutting_) {
      const size_t room = kMaxLineBytes - partial_.size();
      partial_.append(piece.substr(0, room));
      if (piece.size() > room) {
        emit(partial_ + kCutMark);
        partial_.clear();
        cutting_ = true;
      }
    }
    if (newline == std::string_view::npos) return;
    if (!cutting_) emit(partial_);
    partial_.clear();
    cutting_ = false;
    bytes.remove_prefix(newline + 1);
  }
}

void LinePrefixer::finish() {
  if (!cutting_ && !partial_.empty()) emit(partial_);
  partial_.clear();
  cutting_ = false;
}

void LinePrefixer::emit(std::string_view line) {
  std::string out;
  out.reserve(prefix_.size() + line.size() + 1);
  out.append(prefix_).append(line).push_back('\n');
  // One write(2) per line: pipes keep writes up to PIPE_BUF whole, and the launcher is the only
  // writer, so lines never mix. A reader that went away (EPIPE) loses the output, not the job.
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::write(out_fd_, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  if (tail_lines_ == 0) return;
  tail_.emplace_back(line);
  if (tail_.size() > tail_lines_) tail_.pop_front();
}

}  // namespace lockstep::launch
