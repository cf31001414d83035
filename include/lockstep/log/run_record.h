#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::log {

// One logged optimizer step (a "step" line of --log-jsonl).
struct StepRecord {
  int64_t step = 0;             // optimizer steps done, counting this one
  int64_t epoch = 0;            // 1-based
  double loss = 0;              // NaN when the log holds null
  double lr = 0;
  double samples_per_s = 0;
  double loss_scale = 0;        // 0 without loss scaling
  int64_t skipped_steps = 0;    // so far
};

// One finished epoch (an "epoch" line).
struct EpochRecord {
  int64_t epoch = 0;
  int64_t step = 0;
  double train_loss = 0;
  double test_acc = 0;
  double train_s = 0;
};

// One skipped step (a "skipped_step" line).
struct SkipRecord {
  int64_t step = 0;
  std::string reason;
};

// A run's --log-jsonl file, read back: what `lockstep report` draws. A resumed run appends to the
// same file and may log some steps again (it continues from its checkpoint, before the last
// logged step); the later line wins, so every series has one value per step, in step order.
struct RunRecord {
  nlohmann::ordered_json settings;  // the last "run" line's settings; null in logs from before it existed
  nlohmann::ordered_json summary;   // the "summary" line (results, memory, profile); null if the run did not finish
  int64_t resumes = 0;              // "run" lines after the first
  std::vector<StepRecord> steps;
  std::vector<EpochRecord> epochs;
  std::vector<SkipRecord> skips;
};

// The longest line read_run_log reads (1 MiB); the longest a run writes is its summary, a few kB.
constexpr size_t kMaxRunLogLineBytes = size_t{1} << 20;

// Reads `path` line by line (memory: the records, never more than one line of the file). Fields
// of the wrong type read as missing. Throws c10::Error naming the file and line for a line that
// is longer than kMaxRunLogLineBytes or not a JSON object,
// and naming the file when it holds no step, epoch or summary line (not a --log-jsonl file).
// Lines of unknown events are ignored, so logs of later versions still read.
RunRecord read_run_log(const std::string& path);

}  // namespace lockstep::log
