#pragma once
// The subcommands of `lockstep`. Each adds itself to the CLI11 app and returns how to run it once
// the command line has been parsed.

#include <CLI/CLI.hpp>

#include <functional>

namespace lockstep::cli {

constexpr int kUsageError = 2;  // exit code for a bad command line

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;  // returns the process exit code
};

Command add_run_command(CLI::App& app);
Command add_train_command(CLI::App& app);

}  // namespace lockstep::cli
