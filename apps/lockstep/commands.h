#pragma once
// The subcommands of `lockstep`. Each adds itself to the CLI11 app and returns how to run it once
// the command line has been parsed.

#include <CLI/CLI.hpp>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::cli {

constexpr int kUsageError = 2;  // exit code for a bad command line

// Library spellings in error messages and this command's words for them ("PipelineOptions::stages"
// -> "--stages"); see with_flag_names.
using Wording = std::vector<std::pair<std::string, std::string>>;

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;  // returns the process exit code
  Wording wording = {};
};

// `program_tail`: the words after the command line's first "--", exactly as given, or nullopt when
// there is no "--" (see main.cpp).
Command add_run_command(CLI::App& app, const std::optional<std::vector<std::string>>& program_tail);
Command add_train_command(CLI::App& app);
Command add_export_command(CLI::App& app);
Command add_predict_command(CLI::App& app);
Command add_tokenize_command(CLI::App& app);
Command add_serve_command(CLI::App& app);
Command add_report_command(CLI::App& app);
Command add_plan_command(CLI::App& app);
// `argv0` and `command_line`: how this process was started, for the results' record.
Command add_bench_command(CLI::App& app, const std::string& argv0, const std::string& command_line);

}  // namespace lockstep::cli
