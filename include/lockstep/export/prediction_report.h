#pragma once

#include <nlohmann/json.hpp>
#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/data/dataset.h"
#include "lockstep/infer/predictor.h"

namespace lockstep::exporting {

struct PredictOptions {
  TORCH_ARG(int64_t, batch_size) = 64;   // samples per forward, the batch whose latency is measured
  TORCH_ARG(int64_t, warmup) = 2;        // first batches left out of the timings (still scored)
  TORCH_ARG(bool, labelled) = true;      // false: the data set's labels are unknown (no accuracy)
  TORCH_ARG(std::string, model) = "the model";  // what an error names: "'model.pt'"
};

// The largest confusion matrix a report keeps (a square of int64 counts), and prints as text.
inline constexpr int64_t kMaxConfusionClasses = 1000;
inline constexpr int64_t kMaxPrintedConfusionClasses = 32;

// What `lockstep predict` reports for one pass over a data set.
struct PredictReport {
  int64_t samples = 0;
  int64_t num_classes = 0;
  int64_t batch_size = 0;
  bool labelled = true;
  int64_t correct = 0;                           // labelled only
  // [true class][predicted class] counts; labelled only, and empty beyond kMaxConfusionClasses.
  std::vector<std::vector<int64_t>> confusion;
  std::vector<int64_t> predicted_counts;         // samples predicted as each class
  std::vector<int64_t> predictions;              // each sample's predicted class, in order
  // Latency of one forward of a full batch (ms), over the timed batches: all full batches after the
  // warmup ones (a final partial batch is scored, not timed). Percentiles by nearest rank.
  int64_t timed_batches = 0;
  double latency_p50_ms = 0, latency_p90_ms = 0, latency_p99_ms = 0, latency_mean_ms = 0;
  double throughput = 0;                         // samples per second over the timed batches

  double accuracy() const { return samples == 0 ? 0.0 : static_cast<double>(correct) / samples; }
  // The report as one JSON object (predictions included only when unlabelled).
  nlohmann::json to_json() const;
  // The report for a person: accuracy, the confusion matrix, latency and throughput.
  std::string to_text() const;
};

// Runs `predictor` over `dataset` in batches of options.batch_size, timing each forward.
PredictReport predict(infer::Predictor& predictor, const data::Dataset& dataset, const PredictOptions& options);

// The value at quantile q in [0, 1] of `values` by nearest rank (q = 0.5: the median); 0 if empty.
double percentile(std::vector<double> values, double q);

}  // namespace lockstep::exporting
