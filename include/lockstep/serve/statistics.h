#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace lockstep::serve {

// A count and the nanoseconds it took, summed (the statistics extension's {"count", "ns"}).
struct Duration {
  int64_t count = 0;
  int64_t ns = 0;
  void add(int64_t nanoseconds, int64_t times = 1) {
    count += times;
    ns += nanoseconds;
  }
};

// One model version's counters, as the KServe v2 statistics extension and Triton's Prometheus
// metrics report them. Thread-safe: HTTP handlers and the batcher's instances record into it.
//
// Per request: success and fail (the whole request, parsing to response), queue (enqueue to the
// start of its batch), compute_input / compute_infer / compute_output (its batch's phases, counted
// once per request in that batch). Per batch: execution_count, and the three compute phases by
// batch size (in samples). inference_count counts samples, as Triton's does.
class ModelStatistics {
 public:
  void record_success(int64_t ns);
  void record_failure(int64_t ns);
  // A batch of `samples` samples from `requests` requests, each of which waited `queue_ns` summed.
  void record_batch(int64_t samples, int64_t requests, int64_t queue_ns, int64_t input_ns, int64_t infer_ns,
                    int64_t output_ns);
  void set_pending(int64_t requests);

  // {"name", "version", "last_inference", "inference_count", "execution_count", "inference_stats",
  // "batch_stats"} for GET /v2/models/{m}/stats.
  nlohmann::json to_json(const std::string& model, const std::string& version) const;

  struct BatchSizeStats {
    Duration compute_input, compute_infer, compute_output;
  };
  // The counters at one moment.
  struct Snapshot {
    int64_t last_inference_ms = 0;  // Unix time of the last batch, ms
    int64_t inference_count = 0;
    int64_t execution_count = 0;
    int64_t pending = 0;
    Duration success, fail, queue, compute_input, compute_infer, compute_output;
    std::map<int64_t, BatchSizeStats> batch_stats;  // by batch size in samples
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mutex_;
  Snapshot s_;
};

// A model version's counters with the labels its metric lines carry.
struct LabelledSnapshot {
  std::string model, version;
  ModelStatistics::Snapshot stats;
};

// The Prometheus text exposition of `versions`: Triton's nv_inference_* families (so dashboards
// written for Triton read lockstep's) and lockstep_batch_size, a histogram of samples per batch.
std::string prometheus_text(const std::vector<LabelledSnapshot>& versions);

}  // namespace lockstep::serve
