#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>

namespace lockstep::launch {

// Lines longer than this (in bytes) are cut into pieces, so a worker that never prints a newline
// cannot make the launcher buffer without bound.
constexpr size_t kMaxLineBytes = 64 * 1024;

// Splits one worker stream (stdout or stderr) into lines and writes each line to `out_fd` as
// "PREFIX line\n" with a single write(2), so lines from different workers never mix mid-line.
// Keeps the last `tail_lines` lines (without prefix) for failure reports.
class LinePrefixer {
 public:
  LinePrefixer(std::string prefix, int out_fd, size_t tail_lines = 0);

  void feed(std::string_view bytes);
  // Ends the stream: an unterminated last line is written with a newline added.
  void finish();

  const std::deque<std::string>& tail() const { return tail_; }

 private:
  void emit(std::string_view line);

  std::string prefix_;
  int out_fd_;
  size_t tail_lines_;
  std::string partial_;  // bytes after the last newline seen
  std::deque<std::string> tail_;
};

}  // namespace lockstep::launch
