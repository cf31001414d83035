#include "lockstep/serve/statistics.h"

#include <array>
#include <chrono>
#include <functional>
#include <sstream>

namespace lockstep::serve {
namespace {

// Upper bounds of lockstep_batch_size's buckets, in samples.
constexpr std::array<int64_t, 9> kBatchSizeBuckets{1, 2, 4, 8, 16, 32, 64, 128, 256};

nlohmann::json duration_json(const Duration& d) { return {{"count", d.count}, {"ns", d.ns}}; }

using Snapshot = ModelStatistics::Snapshot;

struct Family {
  const char* name;
  const char* type;
  const char* help;
  std::function<int64_t(const Snapshot&)> value;
};

const std::vector<Family>& families() {
  static const std::vector<Family> f{
      {"nv_inference_request_success", "counter", "Number of successful inference requests",
       [](const Snapshot& s) { return s.success.count; }},
      {"nv_inference_request_failure", "counter", "Number of failed inference requests",
       [](const Snapshot& s) { return s.fail.count; }},
      {"nv_inference_count", "counter", "Number of inferences performed (samples: a batch of n counts n)",
       [](const Snapshot& s) { return s.inference_count; }},
      {"nv_inference_exec_count", "counter", "Number of model executions (batches)",
       [](const Snapshot& s) { return s.execution_count; }},
      {"nv_inference_pending_request_count", "gauge", "Requests waiting in the queue",
       [](const Snapshot& s) { return s.pending; }},
      {"nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds",
       [](const Snapshot& s) { return (s.success.ns + s.fail.ns) / 1000; }},
      {"nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds",
       [](const Snapshot& s) { return s.queue.ns / 1000; }},
      {"nv_inference_compute_input_duration_us", "counter", "Cumulative compute input duration in microseconds",
       [](const Snapshot& s) { return s.compute_input.ns / 1000; }},
      {"nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration in microseconds",
       [](const Snapshot& s) { return s.compute_infer.ns / 1000; }},
      {"nv_inference_compute_output_duration_us", "counter", "Cumulative compute output duration in microseconds",
       [](const Snapshot& s) { return s.compute_output.ns / 1000; }},
  };
  return f;
}

}  // namespace

void ModelStatistics::record_success(int64_t ns) {
  std::lock_guard<std::mutex> lock(mutex_);
  s_.success.add(ns);
}

void ModelStatistics::record_failure(int64_t ns) {
  std::lock_guard<std::mutex> lock(mutex_);
  s_.fail.add(ns);
}

void ModelStatistics::record_batch(int64_t samples, int64_t requests, int64_t queue_ns, int64_t input_ns,
                                   int64_t infer_ns, int64_t output_ns) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  std::lock_guard<std::mutex> lock(mutex_);
  s_.last_inference_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now).count();
  s_.inference_count += samples;
  s_.execution_count += 1;
  s_.queue.add(queue_ns, requests);
  s_.compute_input.add(input_ns * requests, requests);
  s_.compute_infer.add(infer_ns * requests, requests);
  s_.compute_output.add(output_ns * requests, requests);
  BatchSizeStats& b = s_.batch_stats[samples];
  b.compute_input.add(input_ns);
  b.compute_infer.add(infer_ns);
  b.compute_output.add(output_ns);
}

void ModelStatistics::set_pending(int64_t requests) {
  std::lock_guard<std::mutex> lock(mutex_);
  s_.pending = requests;
}

ModelStatistics::Snapshot ModelStatistics::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return s_;
}

nlohmann::json ModelStatistics::to_json(const std::string& model, const std::string& version) const {
  const Snapshot s = snapshot();
  nlohmann::json batches = nlohmann::json::array();
  for (const auto& [size, b] : s.batch_stats)
    batches.push_back({{"batch_size", size},
                       {"compute_input", duration_json(b.compute_input)},
                       {"compute_infer", duration_json(b.compute_infer)},
                       {"compute_output", duration_json(b.compute_output)}});
  return {{"name", model},
          {"version", version},
          {"last_inference", s.last_inference_ms},
          {"inference_count", s.inference_count},
          {"execution_count", s.execution_count},
          {"inference_stats",
           {{"success", duration_json(s.success)},
            {"fail", duration_json(s.fail)},
            {"queue", duration_json(s.queue)},
            {"compute_input", duration_json(s.compute_input)},
            {"compute_infer", duration_json(s.compute_infer)},
            {"compute_output", duration_json(s.compute_output)}}},
          {"batch_stats", batches}};
}

std::string prometheus_text(const std::vector<LabelledSnapshot>& versions) {
  std::ostringstream out;
  auto labels = [](const LabelledSnapshot& v) { return "model=\"" + v.model + "\",version=\"" + v.version + "\""; };
  for (const Family& f : families()) {
    out << "# HELP " << f.name << " " << f.help << "\n# TYPE " << f.name << " " << f.type << "\n";
    for (const LabelledSnapshot& v : versions) out << f.name << "{" << labels(v) << "} " << f.value(v.stats) << "\n";
  }
  out << "# HELP lockstep_batch_size Samples per model execution\n# TYPE lockstep_batch_size histogram\n";
  for (const LabelledSnapshot& v : versions) {
    int64_t samples = 0;
    for (int64_t bound : kBatchSizeBuckets) {
      int64_t at_most = 0;  // batches of at most `bound` samples
      for (const auto& [size, b] : v.stats.batch_stats)
        if (size <= bound) at_most += b.compute_infer.count;
      out << "lockstep_batch_size_bucket{" << labels(v) << ",le=\"" << bound << "\"} " << at_most << "\n";
    }
    for (const auto& [size, b] : v.stats.batch_stats) samples += size * b.compute_infer.count;
    out << "lockstep_batch_size_bucket{" << labels(v) << ",le=\"+Inf\"} " << v.stats.execution_count << "\n"
        << "lockstep_batch_size_sum{" << labels(v) << "} " << samples << "\n"
        << "lockstep_batch_size_count{" << labels(v) << "} " << v.stats.execution_count << "\n";
  }
  return out.str();
}

}  // namespace lockstep::serve
