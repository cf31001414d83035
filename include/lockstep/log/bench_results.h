#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::log {

// One configuration's outcome in `lockstep bench` (a row of results.csv / .json / .md).
struct BenchRow {
  std::string name;                 // "ddp + bf16 O1", "pytorch ddp"
  std::string implementation = "lockstep";  // or "pytorch" (the Python peer)
  std::string setup;                // world size x threads and what differs, for the table
  int64_t world_size = 1;
  int64_t threads = 1;              // intra-op threads per process
  bool ok = false;
  std::string error;                // when !ok: the run's last error line
  double train_s = 0;               // training time, evaluation excluded
  double samples_per_s = 0;         // all ranks' training samples per second
  double peak_rss_mib = 0;          // rank 0's
  int64_t param_bytes = 0;          // rank 0's parameters, gradients and optimizer state (0: not reported)
  int64_t grad_bytes = 0;
  int64_t optim_bytes = 0;
  int64_t comm_bytes_per_step = 0;  // bytes one rank sends per optimizer step (gradients, shards)
  double final_loss = 0;
  double test_acc = 0;
  std::string note;                 // why the row reads as it does (pure half's accuracy, ...)
  // How the row trained, as the run resolved it (its JSONL log's settings; the peer's from its
  // flags): what bench_advice pairs rows by. Empty strings: unknown (a results.json from before).
  std::string strategy;             // "ddp", "zero2", ...
  std::string precision;            // "fp32", "bf16"
  std::string opt_level;            // "O0" .. "O3"
  bool sync_bn = false;
  std::string data;                 // "fashion-mnist", "imagefolder", ...
  int64_t accum_steps = 1;
};

struct BenchResults {
  std::string date;     // ISO 8601, UTC
  std::string cpu;      // model name from /proc/cpuinfo
  int64_t cores = 0;    // cores this process may use
  std::string command;  // the bench command line
  std::vector<BenchRow> rows;
};

nlohmann::ordered_json to_json(const BenchResults& results);
// Throws c10::Error naming `source` and the missing key for a malformed results.json.
BenchResults bench_results_from_json(const nlohmann::ordered_json& j, const std::string& source);
// DIR/results.json, as `lockstep bench --out DIR` wrote it.
BenchResults read_bench_results(const std::string& dir);

// results.csv: a header, then one line per row (RFC 4180 quoting).
std::string to_csv(const BenchResults& results);
// results.md: the machine and command, the table, and what to pick (bench_advice).
std::string to_markdown(const BenchResults& results);

// What to pick, read off the table: each sentence compares rows that differ in one respect
// (precision, strategy, SyncBN, accumulation, where the data comes from, the implementation) and
// gives the measured ratio and what follows from it on this machine. A comparison whose rows are
// missing or failed is left out; no sentence is fixed text.
std::vector<std::string> bench_advice(const BenchResults& results);

// Global samples/s per configuration, one bar each (failed rows left out).
std::string throughput_chart_svg(const BenchResults& results);
// Rank 0's memory per configuration: parameters, gradients and optimizer state stacked, then the
// rest of its peak RSS (activations, the framework, the data) as "other", in MiB.
std::string memory_chart_svg(const BenchResults& results);

}  // namespace lockstep::log
