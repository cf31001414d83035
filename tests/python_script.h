#pragma once
// Running the scripts of tests/python, which write models and the numbers Python computes for them.

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "test_util.h"

namespace lockstep::testing {

// tests/python/SCRIPT OUT_DIR run with python_with_torch(); nullopt when there is no Python with
// torch (the caller skips).
inline std::optional<CommandResult> run_python_script(const std::string& script, const std::string& out_dir) {
  const std::string python = python_with_torch();
  if (python.empty()) return std::nullopt;
  return run_command(python + " " + std::string(LOCKSTEP_SOURCE_DIR) + "/tests/python/" + script + " " + out_dir);
}

// What tests/python/SCRIPT wrote into `dir` when run as `SCRIPT dir ARGS`; `error` holds its output
// when it failed, and `dir` is then empty.
struct PythonFixture {
  std::string dir;
  std::string error;
};

// The files a deterministic script writes, made once per build and read by every test process
// after it: ctest runs each test in a process of its own, and Python's start with torch and
// torchvision costs ~2 s of each. They live in BUILD/test-fixtures/<script>-<hash of the script's
// text and the args>, so an edited script runs again. The script writes into a directory of its
// own, renamed into place when it succeeds: processes that race each write one and one rename
// wins, and a failed or interrupted run leaves nothing that looks finished.
inline PythonFixture python_fixture(const std::string& script, const std::string& args = "") {
  namespace fs = std::filesystem;
  const std::string source = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/python/" + script;
  const size_t key = std::hash<std::string>()(read_text(source) + '\0' + args);
  const fs::path root = fs::path(LOCKSTEP_CLI).parent_path() / "test-fixtures";
  const fs::path done = root / (script + "-" + std::to_string(key));
  if (fs::is_directory(done)) return {done.string(), ""};
  const std::string python = python_with_torch();
  if (python.empty()) return {"", kNoPythonTorch};
  const fs::path making = root / (done.filename().string() + ".making-" + std::to_string(::getpid()));
  fs::remove_all(making);
  fs::create_directories(making);
  const CommandResult run = run_command(python + " " + source + " " + making.string() + " " + args);
  if (run.exit_code != 0) {
    fs::remove_all(making);
    return {"", script + " failed:\n" + run.output};
  }
  std::error_code ec;
  fs::rename(making, done, ec);  // another process's copy may have won: then use that one
  if (ec) fs::remove_all(making);
  return {done.string(), ""};
}

}  // namespace lockstep::testing
