#include "lockstep/bench/pipeline_sweep.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "lockstep/bench/child_run.h"
#include "lockstep/core/process.h"
#include "lockstep/parallel/pipeline_schedule.h"

namespace lockstep::bench {
namespace {

struct SweepRowSpec {
  std::string key;   // its log file's name
  PipelineSweepRow row;
  std::vector<std::string> args;  // added to `lockstep train`
};

// The rows of Note [The pipeline sweep], in the order they run and are tabled.
std::vector<SweepRowSpec> sweep_rows(const PipelineSweepOptions& s) {
  const std::string k = std::to_string(s.stages());
  std::vector<SweepRowSpec> rows;
  PipelineSweepRow one;
  one.name = "one process";
  rows.push_back({"one-process", one, {"--strategy", "local"}});
  PipelineSweepRow plain;
  plain.name = "model parallel", plain.ranks = s.stages(), plain.bubble = parallel::bubble_fraction(s.stages(), 1);
  rows.push_back({"model-parallel", plain,
                  {"--strategy", "pipeline", "--stages", k, "--micro-batches", "1", "--balance", s.balance()}});
  for (int64_t m : s.micro_batches())
    for (const std::string& schedule : parallel::pipeline_schedule_names()) {
      PipelineSweepRow r;
      r.name = schedule + " M=" + std::to_string(m), r.schedule = schedule, r.micro_batches = m;
      r.ranks = s.stages(), r.bubble = parallel::bubble_fraction(s.stages(), m);
      rows.push_back({schedule + "-m" + std::to_string(m), r,
                      {"--strategy", "pipeline", "--stages", k, "--micro-batches", std::to_string(m), "--schedule", schedule,
                       "--balance", s.balance()}});
    }
  return rows;
}

// Runs one row and reads its summary (see TrainResult::summary_json) into spec.row.
PipelineSweepRow run_row(const BenchOptions& o, const SweepRowSpec& spec) {
  PipelineSweepRow r = spec.row;
  std::vector<std::string> argv;
  if (r.ranks > 1) argv = {o.lockstep(), "run", "--nproc-per-node", std::to_string(r.ranks), "--"};
  const std::vector<std::string> train{o.lockstep(), "train", "--quiet", "--model", o.model(), "--data", o.data(),
                                       "--limit", std::to_string(o.limit()), "--epochs", std::to_string(o.epochs()),
                                       "--batch-size", std::to_string(o.global_batch()), "--lr", std::to_string(o.lr()),
                                       "--threads", "1", "--profile", "--report-memory",
                                       "--ignore-memory-plan"};  // as lockstep bench's rows (runner.cpp)
  argv.insert(argv.end(), train.begin(), train.end());
  argv.insert(argv.end(), spec.args.begin(), spec.args.end());
  const std::string log = o.out() + "/logs/" + spec.key + ".log";
  const auto code = run_child(argv, {"OMP_NUM_THREADS=1"}, log, o.timeout());
  const nlohmann::json s = last_json(log);
  r.ok = code == 0 && !s.is_null();
  if (!r.ok) {
    r.error = failure(log, code, o.timeout());
    return r;
  }
  const double steps = s.value("steps", 0.0);
  r.step_s = steps > 0 ? s.value("train_s", 0.0) / steps : 0.0;
  r.samples_per_s = s.value("samples_per_s", 0.0);
  r.peak_rss_mib = s.value("peak_rss_mib", 0.0);
  if (s.contains("ranks"))
    for (const auto& f : s["ranks"])
      r.stages.push_back({f.value("peak_rss_mib", 0.0), f.value("step_ms", 0.0), f.value("sync_ms", 0.0),
                          f.value("activation_bytes", int64_t{0})});
  return r;
}

std::string row_line(const PipelineSweepRow& r) {
  if (!r.ok) return "failed: " + r.error;
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%.1f ms per step, %.1f samples/s, peak RSS %.0f MiB", r.step_s * 1000.0,
                r.samples_per_s, r.peak_rss_mib);
  std::string line = buf;
  for (size_t s = 0; s < r.stages.size(); ++s) {
    std::snprintf(buf, sizeof(buf), "; stage %zu idle %.0f%%", s, 100.0 * r.stages[s].idle_fraction());
    line += buf;
  }
  return line;
}

}  // namespace

void PipelineSweepOptions::validate(int64_t global_batch) const {
  TORCH_CHECK_VALUE(stages() >= 2, "--stages ", stages(), ": the pipeline sweep needs at least 2 stages");
  TORCH_CHECK_VALUE(!micro_batches().empty(), "--micro-batch-counts is empty: give at least one M >= 2");
  for (int64_t m : micro_batches())
    TORCH_CHECK_VALUE(m >= 2 && m <= global_batch, "--micro-batch-counts ", c10::Join(",", micro_batches()), ": M=", m,
                      " must be at least 2 (M=1 is the model-parallel row) and at most the batch (--batch-size ",
                      global_batch, ")");
  const auto& names = parallel::pipeline_balance_names();
  TORCH_CHECK_VALUE(std::find(names.begin(), names.end(), balance()) != names.end(), "--balance ", balance(),
                    " is not one of ", c10::Join(", ", names));
}

PipelineSweepResults run_pipeline_sweep(const BenchOptions& bench, const PipelineSweepOptions& sweep,
                                        const std::function<void(const std::string&)>& progress) {
  bench.validate();
  sweep.validate(bench.global_batch());
  TORCH_CHECK_VALUE(!bench.peer(), "--peer: the pipeline sweep has no Python peer; drop --peer");
  std::filesystem::create_directories(bench.out() + "/logs");
  PipelineSweepResults results;
  results.date = utc_now(), results.cpu = cpu_model(), results.cores = available_cores();
  results.command = bench.command(), results.model = bench.model(), results.batch = bench.global_batch();
  results.stages = sweep.stages(), results.balance = sweep.balance();
  const std::vector<SweepRowSpec> rows = sweep_rows(sweep);
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string label = c10::str("[", i + 1, "/", rows.size(), "] ", rows[i].row.name);
    progress(label + " ...");
    results.rows.push_back(run_row(bench, rows[i]));
    progress(label + ": " + row_line(results.rows.back()));
  }
  write_pipeline_sweep_outputs(results, bench.out());
  return results;
}

}  // namespace lockstep::bench
