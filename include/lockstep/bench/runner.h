#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/bench/matrix.h"
#include "lockstep/log/bench_results.h"

namespace lockstep::bench {

struct BenchOptions {
  TORCH_ARG(std::string, lockstep) = "lockstep";      // the binary every row runs (this one)
  TORCH_ARG(std::string, model) = "convnet";
  TORCH_ARG(std::string, data) = "fashion-mnist";     // or synthetic
  TORCH_ARG(int64_t, limit) = 0;                      // training samples; 0: all
  TORCH_ARG(int64_t, epochs) = 1;
  TORCH_ARG(int64_t, global_batch) = 200;             // samples per optimizer step over all ranks
  TORCH_ARG(double, lr) = 0.02;                       // sgd, momentum 0.9, as in lockstep and the peer
  TORCH_ARG(std::string, only) = "";                  // comma-separated configuration keys; "": all
  TORCH_ARG(bool, peer) = false;                      // also run PyTorch's counterparts
  TORCH_ARG(std::string, peer_dir) = "bench";  // fmnist_ddp.py and run_ddp.sh (PyTorch 2.x, the venv's)
  TORCH_ARG(std::string, out) = "bench-results";
  TORCH_ARG(double, timeout) = 3600.0;                // seconds one row may take before it is killed
  TORCH_ARG(std::string, command) = "";               // the command line, for the record

 public:
  // Throws c10::ValueError naming the bad value.
  void validate() const;
};

// Runs every selected configuration as a child process (`lockstep train`, under `lockstep run`
// for several ranks), one after another, each with its world size and threads; with peer, the
// Python counterpart of a row runs right after it (alternating, so machine noise hits both).
// `progress` gets one line as each row starts and ends. A failed row is recorded with its error
// and the bench goes on. Each row's output is kept in OUT/logs/<key>.log. Returns the results
// (also written to OUT: results.csv, results.json, results.md, throughput.svg, memory.svg).
log::BenchResults run_bench(const BenchOptions& options, const std::vector<BenchConfig>& matrix,
                            const std::function<void(const std::string&)>& progress);

// Writes results.csv, results.json, results.md, throughput.svg and memory.svg into `dir`
// (created if missing), each atomically.
void write_bench_outputs(const log::BenchResults& results, const std::string& dir);

}  // namespace lockstep::bench
