#pragma once
// Running the scripts of tests/python, which write models and the numbers Python computes for them.

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

}  // namespace lockstep::testing
