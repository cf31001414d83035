// See Note [The alpha-beta model] and Note [A step's exposed communication].
#include "lockstep/dist/cost_model.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "lockstep/core/world.h"

namespace lockstep::dist {
namespace {

constexpr int64_t kPieceBytes = int64_t{2} << 20;  // HierarchicalAllReduce's pieces

// "100Gbit" -> bits per second; "5us" -> seconds. -1 when `text` is not of that form.
double scaled(const std::string& text, const std::vector<std::pair<std::string, double>>& units) {
  size_t end = 0;
  double value = 0.0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    return -1.0;
  }
  std::string unit = text.substr(end);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& [name, factor] : units)
    if (unit == name) return value > 0.0 ? value * factor : -1.0;
  return -1.0;
}

}  // namespace

LinkCost LinkCost::parse(const std::string& spec) {
  const size_t slash = spec.find('/');
  const std::string form = "RATE/LATENCY, e.g. 100Gbit/5us or 1gbit/250us";
  TORCH_CHECK_VALUE(slash != std::string::npos, "link '", spec, "' has no '/': give ", form);
  const double bits = scaled(spec.substr(0, slash), {{"bit", 1.0}, {"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9},
                                                     {"tbit", 1e12}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12}});
  const double latency = scaled(spec.substr(slash + 1), {{"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3}, {"s", 1.0}});
  TORCH_CHECK_VALUE(bits > 0.0, "link '", spec, "': rate '", spec.substr(0, slash),
                    "' is not a positive number of bit/s with bit, kbit, Mbit, Gbit or Tbit; give ", form);
  TORCH_CHECK_VALUE(latency > 0.0, "link '", spec, "': latency '", spec.substr(slash + 1),
                    "' is not a positive time in ns, us, ms or s; give ", form);
  return LinkCost{latency, 8.0 / bits};
}

void ClusterShape::validate() const {
  // Bounds before the product: ranks_per_host <= kMaxWorldSize / hosts cannot overflow.
  TORCH_CHECK_VALUE(hosts >= 1 && ranks_per_host >= 1 && ranks_per_host <= kMaxWorldSize / hosts, "a cluster of ",
                    hosts, " hosts (ClusterShape::hosts) x ", ranks_per_host,
                    " ranks per host (ClusterShape::ranks_per_host) is not a job lockstep runs: each must be at "
                    "least 1 and their product at most ", kMaxWorldSize, " ranks (2^20, the most a job may have); "
                    "give fewer hosts or ranks per host");
}

int64_t ClusterShape::ranks() const {
  validate();
  return hosts * ranks_per_host;
}

int64_t StepShape::buckets() const {
  TORCH_CHECK_VALUE(first_bucket_bytes >= 1 && bucket_bytes >= 1, "step shape: buckets of first_bucket_bytes ",
                    first_bucket_bytes, " and bucket_bytes ", bucket_bytes, " must hold at least 1 byte each");
  TORCH_CHECK_VALUE(gradient_bytes >= 0 && forward_s >= 0.0 && backward_s >= 0.0 && optimizer_s >= 0.0,
                    "step shape: gradient_bytes ", gradient_bytes, ", forward_s ", forward_s, ", backward_s ",
                    backward_s, " and optimizer_s ", optimizer_s, " must not be negative");
  if (gradient_bytes == 0) return 0;
  const int64_t rest = std::max<int64_t>(0, gradient_bytes - first_bucket_bytes);
  const int64_t n = 1 + rest / bucket_bytes + (rest % bucket_bytes != 0 ? 1 : 0);  // no sum that can overflow
  TORCH_CHECK_VALUE(n <= kMaxBuckets, "step shape: gradient_bytes ", gradient_bytes, " in buckets of bucket_bytes ",
                    bucket_bytes, " make ", n, " buckets, more than the ", kMaxBuckets,
                    " a prediction walks through (StepShape::kMaxBuckets); give larger buckets");
  return n;
}

std::string LinkCost::describe() const {
  char text[128];
  std::snprintf(text, sizeof(text), "alpha %.1f us, beta %.4f ns/B (%.3f GB/s)", alpha * 1e6, beta * 1e9,
                beta > 0.0 ? 1e-9 / beta : 0.0);
  return text;
}

double CollectiveCosts::all_reduce_seconds(int64_t bytes, const ClusterShape& shape,
                                           AllReduceAlgorithm algorithm) const {
  TORCH_CHECK_VALUE(bytes >= 0, "all-reduce of ", bytes, " bytes: a message is not negative");
  const double s = static_cast<double>(bytes);
  const int64_t h = shape.hosts, l = shape.ranks_per_host, n = shape.ranks();
  if (n == 1) return 0.0;
  if (h == 1) return host.alpha + s * host.beta;
  const bool hierarchical = algorithm == AllReduceAlgorithm::kHierarchical && l >= 2;
  if (!hierarchical) {
    const double steps = 2.0 * static_cast<double>(n - 1);
    return steps * link.alpha + steps / static_cast<double>(n) * s * link.beta;
  }
  const double steps = 2.0 * static_cast<double>(h - 1);
  const double piece = static_cast<double>(std::min<int64_t>(bytes, kPieceBytes));
  return steps * link.alpha + steps / static_cast<double>(h) * s * link.beta + 2.0 * (host.alpha + piece * host.beta);
}

LinkCost fit_line(const std::vector<double>& bytes, const std::vector<double>& seconds) {
  TORCH_CHECK_VALUE(bytes.size() == seconds.size(), "fit_line: ", bytes.size(), " sizes but ", seconds.size(), " times");
  TORCH_CHECK_VALUE(std::any_of(bytes.begin(), bytes.end(), [&](double b) { return b != bytes[0]; }),
                    "fit_line: needs at least two distinct sizes, got ", bytes.size(), " point(s)");
  // Weighted least squares of t = a + b x, weights 1/t^2: the normal equations.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    TORCH_CHECK_VALUE(seconds[i] > 0.0, "fit_line: time ", seconds[i], " s at ", bytes[i], " bytes is not positive");
    const double w = 1.0 / (seconds[i] * seconds[i]);
    sw += w;
    sx += w * bytes[i];
    sy += w * seconds[i];
    sxx += w * bytes[i] * bytes[i];
    sxy += w * bytes[i] * seconds[i];
  }
  const double det = sw * sxx - sx * sx;
  const double alpha = (sxx * sy - sx * sxy) / det;
  if (alpha >= 0.0) return LinkCost{alpha, (sw * sxy - sx * sy) / det};
  return LinkCost{0.0, sxy / sxx};  // a latency is not negative: the best line through the origin
}

StepPrediction predict_step(const StepShape& step, const CollectiveCosts& costs, const ClusterShape& shape,
                            AllReduceAlgorithm algorithm) {
  step.buckets();  // see StepShape::kMaxBuckets
  shape.validate();
  StepPrediction p;
  double done = 0.0;  // when the previous bucket's all-reduce ended, from the start of backward
  int64_t filled = 0;
  while (filled < step.gradient_bytes) {
    const int64_t cap = filled == 0 ? step.first_bucket_bytes : step.bucket_bytes;
    const int64_t bucket = std::min(cap, step.gradient_bytes - filled);
    filled += bucket;
    const double ready = step.backward_s * static_cast<double>(filled) / static_cast<double>(step.gradient_bytes);
    const double took = costs.all_reduce_seconds(bucket, shape, algorithm);
    p.communication_s += took;
    done = std::max(done, ready) + took;
  }
  p.exposed_s = std::max(0.0, done - step.backward_s);
  p.step_s = step.forward_s + step.backward_s + p.exposed_s + step.optimizer_s;
  return p;
}

}  // namespace lockstep::dist
