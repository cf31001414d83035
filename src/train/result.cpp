#include "lockstep/train/result.h"

#include <nlohmann/json.hpp>

#include <cmath>

namespace lockstep::train {
namespace {

double round_to(double x, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(x * scale) / scale;
}

}  // namespace

std::string TrainResult::summary_json() const {
  nlohmann::ordered_json j;
  j["world_size"] = world_size;
  j["samples_per_s"] = round_to(samples_per_s, 1);
  j["train_s"] = round_to(train_s, 3);
  j["test_acc"] = round_to(test_acc, 4);
  if (!std::isnan(test_loss)) j["test_loss"] = round_to(test_loss, 6);  // a language model's, or Metric::kNone's
  if (!std::isnan(perplexity)) j["perplexity"] = round_to(perplexity, 3);
  j["final_loss"] = round_to(final_loss, 6);
  j["peak_rss_mib"] = round_to(peak_rss_mib, 1);
  j["param_bytes"] = param_bytes;
  j["grad_bytes"] = grad_bytes;
  j["optim_bytes"] = optim_bytes;
  j["sent_bytes_per_step"] = sent_bytes_per_step;
  j["steps"] = steps;
  j["skipped_steps"] = skipped_steps;
  for (const auto& [key, value] : figures) j[key] = round_to(value, 4);
  for (const RankFigures& f : ranks)
    j["ranks"].push_back({{"rank", f.rank}, {"peak_rss_mib", round_to(f.peak_rss_mib, 1)}, {"step_ms", round_to(f.step_ms, 3)},
                          {"sync_ms", round_to(f.sync_ms, 3)}, {"activation_bytes", f.activation_bytes}});
  return j.dump();
}

}  // namespace lockstep::train
