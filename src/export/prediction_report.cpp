#include "lockstep/export/prediction_report.h"

#include <torch/torch.h>

#include "lockstep/models/classifier.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <numeric>
#include <sstream>

namespace lockstep::exporting {

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  // Nearest rank: the smallest value with at least q of the values at or below it.
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}

PredictReport predict(infer::Predictor& predictor, const data::Dataset& dataset, const PredictOptions& options) {
  TORCH_CHECK_VALUE(options.batch_size() >= 1, "batch size ", options.batch_size(), " must be at least 1");
  TORCH_CHECK_VALUE(options.warmup() >= 0, "warmup ", options.warmup(), " must be >= 0");
  TORCH_CHECK_VALUE(dataset.size() >= 1, "the data set to predict on is empty");
  PredictReport r;
  r.samples = dataset.size();
  r.batch_size = options.batch_size();
  r.labelled = options.labelled();
  std::vector<double> latencies_ms;
  std::vector<torch::Tensor> predicted;
  for (int64_t start = 0, batch = 0; start < r.samples; start += options.batch_size(), ++batch) {
    const int64_t n = std::min(options.batch_size(), r.samples - start);
    const auto [images, labels] = dataset.batch(torch::arange(start, start + n, torch::kLong));
    const auto t0 = std::chrono::steady_clock::now();
    const torch::Tensor logits = predictor.forward(images);  // (n, classes) fp32
    const auto t1 = std::chrono::steady_clock::now();
    if (batch >= options.warmup() && n == options.batch_size())
      latencies_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    const std::string rows = "samples " + std::to_string(start) + "-" + std::to_string(start + n - 1);
    models::check_logits(logits, images, r.num_classes, options.model(), rows);
    r.num_classes = logits.size(1);
    predicted.push_back(logits.argmax(1));
  }
  const torch::Tensor classes = torch::cat(predicted);  // (N) int64
  r.predictions.assign(classes.data_ptr<int64_t>(), classes.data_ptr<int64_t>() + r.samples);
  r.predicted_counts.assign(r.num_classes, 0);
  for (int64_t c : r.predictions) ++r.predicted_counts[c];
  if (r.labelled) {
    r.num_classes = std::max(r.num_classes, dataset.num_classes);
    r.predicted_counts.resize(r.num_classes, 0);
    const bool confusion = r.num_classes <= kMaxConfusionClasses;
    if (confusion) r.confusion.assign(r.num_classes, std::vector<int64_t>(r.num_classes, 0));
    const torch::Tensor labels = dataset.labels.to(torch::kLong).contiguous();
    for (int64_t i = 0; i < r.samples; ++i) {
      const int64_t truth = labels.data_ptr<int64_t>()[i];
      TORCH_CHECK(truth >= 0 && truth < r.num_classes, "label ", truth, " of sample ", i,
                  " is outside the model's classes [0, ", r.num_classes, ")");
      if (confusion) ++r.confusion[truth][r.predictions[i]];
      r.correct += truth == r.predictions[i];
    }
  }
  r.timed_batches = static_cast<int64_t>(latencies_ms.size());
  if (!latencies_ms.empty()) {
    const double total_ms = std::accumulate(latencies_ms.begin(), latencies_ms.end(), 0.0);
    r.latency_p50_ms = percentile(latencies_ms, 0.50);
    r.latency_p90_ms = percentile(latencies_ms, 0.90);
    r.latency_p99_ms = percentile(latencies_ms, 0.99);
    r.latency_mean_ms = total_ms / r.timed_batches;
    r.throughput = total_ms > 0 ? r.timed_batches * r.batch_size * 1000.0 / total_ms : 0.0;
  }
  return r;
}

nlohmann::json PredictReport::to_json() const {
  nlohmann::json j{{"samples", samples},
                   {"num_classes", num_classes},
                   {"batch_size", batch_size},
                   {"predicted_counts", predicted_counts},
                   {"latency_ms", {{"p50", latency_p50_ms}, {"p90", latency_p90_ms}, {"p99", latency_p99_ms},
                                   {"mean", latency_mean_ms}, {"timed_batches", timed_batches}}},
                   {"throughput_samples_per_s", throughput}};
  if (labelled) {
    j["accuracy"] = accuracy();
    j["correct"] = correct;
    j["confusion"] = confusion.empty() ? nlohmann::json(nullptr) : nlohmann::json(confusion);
  } else {
    j["predictions"] = predictions;
  }
  return j;
}

std::string PredictReport::to_text() const {
  std::ostringstream s;
  s << std::fixed;
  if (labelled) {
    s << "accuracy " << std::setprecision(4) << accuracy() << " (" << correct << " of " << samples << ")\n";
    if (num_classes > kMaxPrintedConfusionClasses) {
      s << "confusion matrix of " << num_classes << " classes: not printed (at most " << kMaxPrintedConfusionClasses
        << "); "
        << (confusion.empty() ? "not kept either (at most " + std::to_string(kMaxConfusionClasses) + " classes)"
                              : std::string("the JSON report has it"))
        << "\n";
    } else {
      s << "confusion matrix (rows: true class, columns: predicted class)\n      ";
      for (int64_t c = 0; c < num_classes; ++c) s << std::setw(6) << c;
      s << "\n";
      for (int64_t t = 0; t < num_classes; ++t) {
        s << std::setw(6) << t;
        for (int64_t c = 0; c < num_classes; ++c) s << std::setw(6) << confusion[t][c];
        s << "\n";
      }
    }
  } else {
    s << samples << " samples, unlabelled; predicted per class:";
    if (num_classes > kMaxPrintedConfusionClasses) {
      s << " " << num_classes << " classes, not printed (at most " << kMaxPrintedConfusionClasses
        << "); the JSON report has the counts";
    } else {
      for (int64_t c = 0; c < num_classes; ++c) s << " " << c << ":" << predicted_counts[c];
    }
    s << "\n";
  }
  if (timed_batches == 0) {
    s << "latency: no full batch of " << batch_size << " after the warmup batches; nothing timed\n";
  } else {
    s << std::setprecision(3) << "latency per batch of " << batch_size << " (" << timed_batches
      << " batches): p50 " << latency_p50_ms << " ms, p90 " << latency_p90_ms << " ms, p99 " << latency_p99_ms
      << " ms; throughput " << std::setprecision(1) << throughput << " samples/s\n";
  }
  return s.str();
}

}  // namespace lockstep::exporting
