#pragma once
// Helpers shared by the test suite: scratch directories and running child commands.

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <c10/util/Exception.h>

namespace lockstep::testing {

// The message (without backtrace) of the c10::Error that `f` throws; "<no error>" when it returns.
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "<no error>";
}

// A fresh directory under TMPDIR, removed with everything in it when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "lockstep-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;  // -1 when the command died by a signal
  std::string output;  // stdout and stderr, interleaved
};

// Runs `command` with /bin/sh, capturing stdout and stderr together.
inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(pipe);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

// The Python peer's interpreter: Debian's python3 with python3-torch (the first python3 on PATH may
// lack torch). Empty when torch cannot be imported there.
inline std::string python_with_torch() {
  static const std::string python = [] {
    const std::string candidate = "/usr/bin/python3";
    return run_command(candidate + " -c 'import torch'").exit_code == 0 ? candidate : std::string();
  }();
  return python;
}

// The last line of `text` that starts with '{' (the JSON summary lockstep prints last).
inline std::string last_json_line(const std::string& text) {
  size_t end = text.size();
  while (end > 0) {
    size_t start = text.rfind('\n', end - 1);
    start = start == std::string::npos ? 0 : start + 1;
    if (start < text.size() && text[start] == '{') return text.substr(start, end - start);
    if (start == 0) break;
    end = start - 1;
  }
  return {};
}

}  // namespace lockstep::testing
