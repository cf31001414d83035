#pragma once

#include <torch/arg.h>

#include <optional>
#include <string>

#include "lockstep/log/bench_results.h"
#include "lockstep/log/run_record.h"

namespace lockstep::log {

struct ReportOptions {
  TORCH_ARG(std::string, run_log) = "";    // a --log-jsonl file
  TORCH_ARG(std::string, bench_dir) = "";  // a `lockstep bench --out` directory; "": none
  TORCH_ARG(std::string, out) = "report.html";
};

// A run's curves as one self-contained HTML page, the TensorBoard view without Python: loss,
// learning rate, throughput, loss scale and skipped steps over steps, test accuracy per epoch, the
// per-phase step profile, rank 0's memory breakdown, the run's settings and, when given, a bench's
// table and charts. Everything is inline (SVG charts, CSS; see Note [Charts that carry their
// values]); the page runs no script and its Content-Security-Policy forbids every fetch.
std::string report_html(const RunRecord& run, const std::string& title, const std::optional<BenchResults>& bench);

// Reads options.run_log() (and the bench directory), writes options.out() atomically. Throws
// c10::Error naming the file that cannot be read or written.
void write_report(const ReportOptions& options);

}  // namespace lockstep::log
