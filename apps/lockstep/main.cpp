// lockstep: the command-line tool.
// Exit codes: 0 success, 1 runtime failure (missing data, I/O), 2 bad command line.
#include <iostream>
#include <vector>

#include <c10/util/Exception.h>

#include "commands.h"

int main(int argc, char** argv) {
  using namespace lockstep::cli;
  CLI::App app{"lockstep: distributed and mixed-precision training for LibTorch"};
  app.set_version_flag("--version", "lockstep 0.1.0");
  app.require_subcommand(0, 1);
  const std::vector<Command> commands{add_run_command(app), add_train_command(app)};

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the error with a hint
    return code == 0 ? 0 : kUsageError;
  }
  try {
    for (const Command& c : commands)
      if (c.app->parsed()) return c.run();
    std::cerr << "lockstep: a subcommand is required\n" << app.help();
    return kUsageError;
  } catch (const c10::ValueError& e) {
    std::cerr << "lockstep: error: " << e.what_without_backtrace() << "\n";
    return kUsageError;
  } catch (const c10::Error& e) {
    std::cerr << "lockstep: error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "lockstep: error: " << e.what() << "\n";
    return 1;
  }
}
