#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/bench/runner.h"

namespace lockstep::bench {

// Note [The pipeline sweep]
// `lockstep bench --pipeline-sweep` repeats the model-parallel write-up's experiment on CPU ranks:
// one process with one thread (one device), plain model parallel (K ranks of one thread, the
// model cut into K stages, one micro-batch: each stage waits for the other), and the pipeline
// with the batch split into M micro-batches for each M of the sweep under both schedules. Every
// row is a child `lockstep train --profile --report-memory` on the same model, data and batch
// (BenchOptions), so rows differ only in how the batch flows. Each rank reports its peak RSS, its
// mean step time and the part of it spent waiting to receive from a neighbour (the profiler's sync
// phase, Note [Pipeline replicas]), and the most activation bytes it held for backward; the table
// puts each stage's idle fraction beside the textbook bubble (K-1)/(M+K-1). Time per step is the
// row's training time over its optimizer steps.

struct PipelineSweepOptions {
  TORCH_ARG(int64_t, stages) = 2;  // K: ranks of the model-parallel and pipelined rows
  // M of the pipelined rows (M = 1 is the model-parallel row); each at most the batch.
  TORCH_ARG(std::vector<int64_t>, micro_batches) = std::vector<int64_t>({2, 4, 8, 16, 32});
  // How the model-parallel and pipelined rows cut their stages: lockstep train's --balance
  // ("time" by default: the bubble formula assumes stages of equal time).
  TORCH_ARG(std::string, balance) = "time";

 public:
  // Throws c10::ValueError naming the bad value: K < 2, an M < 2 or larger than `global_batch`,
  // an unknown balance.
  void validate(int64_t global_batch) const;
};

// One rank (= stage) of a row.
struct StageFigures {
  double peak_rss_mib = 0;
  double step_ms = 0;            // its mean wall time per step (the profiler's)
  double idle_ms = 0;            // of it, blocked receiving from a neighbour
  int64_t activation_bytes = 0;  // the most held for backward at once
  double idle_fraction() const { return step_ms > 0 ? idle_ms / step_ms : 0.0; }
};

struct PipelineSweepRow {
  std::string name;            // "one process", "model parallel", "gpipe M=8", "1f1b M=8"
  std::string schedule;        // "", "gpipe" or "1f1b"
  int64_t micro_batches = 1;   // M
  int64_t ranks = 1;
  bool ok = false;
  std::string error;
  double step_s = 0;           // training time / optimizer steps
  double samples_per_s = 0;
  double peak_rss_mib = 0;     // rank 0's
  double bubble = 0;           // (K-1)/(M+K-1); 0 for one process
  std::vector<StageFigures> stages;  // one per rank (empty for one process)
};

struct PipelineSweepResults {
  std::string date, cpu, command;
  int64_t cores = 0;
  std::string model;
  int64_t batch = 0;   // samples per optimizer step
  int64_t stages = 0;  // K
  std::string balance;  // how stages were cut: "params" or "time"
  std::vector<PipelineSweepRow> rows;
};

// Runs the rows one after another as child processes (see Note [The pipeline sweep]); `progress`
// gets a line as each starts and ends. A failed row is recorded with its error and the sweep goes
// on; each row's output is kept in OUT/logs/. Writes the outputs (below) into bench.out().
PipelineSweepResults run_pipeline_sweep(const BenchOptions& bench, const PipelineSweepOptions& sweep,
                                        const std::function<void(const std::string&)>& progress);

// pipeline_sweep.json, .csv and .md, time_per_step.svg (time per step against M, one line per
// schedule, the one-process and model-parallel times as flat lines) and idle.svg (each stage's
// measured idle fraction against M beside the bubble formula), each written atomically into `dir`.
void write_pipeline_sweep_outputs(const PipelineSweepResults& results, const std::string& dir);

std::string pipeline_sweep_markdown(const PipelineSweepResults& results);
std::string pipeline_sweep_csv(const PipelineSweepResults& results);
std::string time_per_step_chart_svg(const PipelineSweepResults& results);
std::string idle_chart_svg(const PipelineSweepResults& results);

}  // namespace lockstep::bench
