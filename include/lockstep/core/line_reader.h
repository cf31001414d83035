#pragma once
// Reads a file line by line holding at most a bounded number of bytes of one line, so that a file
// without newlines (/dev/zero, a binary file, a minified dump) costs a bounded amount of memory
// and time before it is refused, and a stream is read only as far as its reader wants.

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace lockstep {

class LineReader {
 public:
  // Throws c10::Error "cannot read <what> '<path>': <reason><hint>" when it cannot be opened.
  LineReader(const std::string& path, size_t max_line_bytes, const std::string& what = "the file",
             const std::string& hint = "")
      : path_(path), max_line_bytes_(max_line_bytes), file_(std::fopen(path.c_str(), "rb")) {
    TORCH_CHECK(file_ != nullptr, "cannot read ", what, " '", path, "': ", std::strerror(errno), hint);
  }
  ~LineReader() { std::fclose(file_); }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line without its '\n' (the last line may lack one); false at the end of the file.
  // A line longer than max_line_bytes is not read further: next() returns true with
  // too_long() set and `line` holding its first max_line_bytes bytes, and the reader is left
  // inside that line (its callers refuse the file there). Throws c10::Error naming the file on a
  // read error.
  bool next(std::string& line) {
    line.clear();
    too_long_ = false;
    bool any = false;
    for (;;) {
      if (begin_ == end_ && !fill()) break;
      any = true;
      const char* start = buffer_ + begin_;
      const auto* newline = static_cast<const char*>(std::memchr(start, '\n', end_ - begin_));
      const size_t n = newline ? static_cast<size_t>(newline - start) : end_ - begin_;
      if (line.size() + n > max_line_bytes_) {
        line.append(start, max_line_bytes_ - line.size());
        too_long_ = true;
        break;
      }
      line.append(start, n);
      begin_ += n;
      if (newline) {
        ++begin_;
        break;
      }
    }
    if (any) ++line_number_;
    return any;
  }

  bool too_long() const { return too_long_; }
  int64_t line_number() const { return line_number_; }  // of the line next() returned, from 1
  const std::string& path() const { return path_; }

 private:
  bool fill() {
    begin_ = 0;
    end_ = std::fread(buffer_, 1, sizeof(buffer_), file_);
    TORCH_CHECK(end_ > 0 || !std::ferror(file_), "reading '", path_, "' failed: ", std::strerror(errno));
    return end_ > 0;
  }

  std::string path_;
  size_t max_line_bytes_;
  std::FILE* file_;
  char buffer_[1 << 16];
  size_t begin_ = 0, end_ = 0;
  int64_t line_number_ = 0;
  bool too_long_ = false;
};

}  // namespace lockstep
