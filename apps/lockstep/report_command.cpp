// `lockstep report`: a run's JSONL log (and a bench directory) as one self-contained HTML page.
#include <iostream>
#include <memory>

#include "commands.h"
#include "lockstep/log/html_report.h"

namespace lockstep::cli {

Command add_report_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "report", "Turn a run's --log-jsonl file into one self-contained HTML page of charts (no Python, no network)");
  cmd->option_defaults()->always_capture_default();
  auto o = std::make_shared<log::ReportOptions>();
  cmd->add_option("run_log", o->run_log(), "The run's log, as `lockstep train --log-jsonl FILE` wrote it")->required();
  cmd->add_option("--bench", o->bench_dir(), "Also show a `lockstep bench --out DIR` directory's table and charts");
  cmd->add_option("--out", o->out(), "The HTML file to write");
  return {cmd, [o] {
            log::write_report(*o);
            std::cout << "lockstep report: wrote " << o->out() << "\n";
            return 0;
          }};
}

}  // namespace lockstep::cli
