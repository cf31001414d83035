#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>

namespace lockstep::launch {

// Note [Long worker lines]
// The launcher holds a worker's line until its newline, to write it whole. A line longer than
// kMaxLineBytes (1 MiB: a long JSON summary fits) is written up to there, ended by kCutMark, and the
// rest of it, up to its newline, is dropped: memory stays bounded by a worker that never prints a
// newline, and a reader can tell a cut line from a whole one (--log-dir files keep every byte).
constexpr size_t kMaxLineBytes = 1024 * 1024;
constexpr const char* kCutMark = " [... line cut at 1048576 bytes; the rest of it is dropped]";

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
  bool cutting_ = false;  // dropping the rest of a cut line, up to its newline
  std::deque<std::string> tail_;
};

}  // namespace lockstep::launch
