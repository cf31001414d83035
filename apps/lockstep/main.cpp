// lockstep: the command-line tool.
// Exit codes: 0 success, 1 runtime failure (missing data, I/O), 2 bad command line.
#include <algorithm>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "checks.h"
#include "commands.h"

int main(int argc, char** argv) {
  using namespace lockstep::cli;
  // Everything after the first "--" is the program `lockstep run` starts, and reaches it byte for
  // byte: CLI11 never sees it, because it would rewrite it ('[a b]' and '[1,2]' are CLI11 list
  // syntax, split into several values).
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string command_line = "lockstep";
  for (const std::string& a : args) command_line += " " + a;
  const auto dashdash = std::find(args.begin(), args.end(), "--");
  std::optional<std::vector<std::string>> tail;
  if (dashdash != args.end()) tail.emplace(dashdash + 1, args.end());
  args.erase(dashdash, args.end());
  std::reverse(args.begin(), args.end());  // CLI11's parse(vector) takes the arguments last first

  CLI::App app{"lockstep: distributed and mixed-precision training for LibTorch", argv[0]};
  app.set_version_flag("--version", "lockstep 0.1.0");
  app.require_subcommand(0, 1);
  const Command run = add_run_command(app, tail);
  const std::vector<Command> commands{run, add_train_command(app), add_export_command(app),
                                      add_predict_command(app), add_tokenize_command(app), add_serve_command(app),
                                      add_report_command(app), add_plan_command(app),
                                      add_bench_command(app, argv[0], command_line)};

  try {
    app.parse(args);
    if (tail && !run.app->parsed())
      throw CLI::ExtrasError("'--' and what follows it are for `lockstep run -- PROGRAM [ARGS...]`; "
                             "no other command takes them",
                             CLI::ExitCodes::ExtrasError);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the error with a hint
    return code == 0 ? 0 : kUsageError;
  } catch (const c10::ValueError& e) {  // a value an option's own parser refused (--nnodes 2:x)
    std::cerr << "lockstep: error: " << e.what_without_backtrace() << "\n";
    return kUsageError;
  }
  const CLI::App* parsed = &app;
  Wording wording;
  try {
    for (const Command& c : commands) {
      if (!c.app->parsed()) continue;
      parsed = c.app;
      wording = c.wording;
      return c.run();
    }
    std::cerr << "lockstep: a subcommand is required\n" << app.help();
    return kUsageError;
  } catch (const c10::ValueError& e) {  // see with_flag_names: the library's option names as flags
    std::cerr << "lockstep: error: " << with_flag_names(e.what_without_backtrace(), *parsed, wording) << "\n";
    return kUsageError;
  } catch (const c10::Error& e) {
    std::cerr << "lockstep: error: " << with_flag_names(e.what_without_backtrace(), *parsed, wording) << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "lockstep: error: " << e.what() << "\n";
    return 1;
  }
}
