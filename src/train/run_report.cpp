#include "run_report.h"

#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>

#include "lockstep/core/process.h"

namespace lockstep::train {

c10::impl::GenericDict resume_settings(const TrainerOptions& o, int64_t world_size) {
  c10::impl::GenericDict run = o.run_settings();
  if (!run.empty()) return run;
  run = string_dict();
  run.insert("world_size", world_size);
  run.insert("batch_size", o.batch_size());
  run.insert("accum_steps", o.accum_steps());
  run.insert("seed", static_cast<int64_t>(o.seed()));
  return run;
}

nlohmann::ordered_json run_event(const TrainerOptions& o, const TrainResult& r, const std::string& strategy,
                                 const std::string& resumed_from) {
  nlohmann::ordered_json s = o.settings();
  if (s.empty())
    s = {{"epochs", o.epochs()}, {"batch_size", o.batch_size()}, {"world_size", r.world_size},
         {"threads", r.threads}, {"strategy", strategy}, {"accum_steps", o.accum_steps()}, {"seed", o.seed()}};
  nlohmann::ordered_json j{{"event", "run"}, {"settings", std::move(s)}};
  if (!resumed_from.empty()) j["resumed_from"] = resumed_from;
  return j;
}

nlohmann::ordered_json summary_event(const TrainResult& r, const StepProfiler& profiler) {
  nlohmann::ordered_json j{{"event", "summary"}};
  const nlohmann::ordered_json summary = nlohmann::ordered_json::parse(r.summary_json());
  for (const auto& [key, value] : summary.items()) j[key] = value;
  if (profiler.enabled()) {
    const ProfileSummary p = profiler.summary();
    nlohmann::ordered_json phases = nlohmann::ordered_json::array();
    for (const PhaseTime& t : p.phases) phases.push_back({{"name", t.name}, {"mean_ms", t.mean_ms}, {"share", t.share}});
    j["profile"] = {{"steps", p.steps}, {"step_mean_ms", p.step_mean_ms}, {"phases", std::move(phases)}};
  }
  return j;
}

std::string epoch_line(const EpochResult& e, int64_t epochs) {
  char line[160];
  const auto epoch = static_cast<long long>(e.epoch), total = static_cast<long long>(epochs);
  if (!std::isnan(e.perplexity)) {
    std::snprintf(line, sizeof(line), "epoch %lld/%lld done: train_loss %.4f test_loss %.4f perplexity %.2f (%.2f s)",
                  epoch, total, e.train_loss, e.test_loss, e.perplexity, e.train_s);
  } else if (!std::isnan(e.test_acc)) {
    std::snprintf(line, sizeof(line), "epoch %lld/%lld done: train_loss %.4f test_acc %.4f (%.2f s)", epoch, total,
                  e.train_loss, e.test_acc, e.train_s);
  } else {
    std::snprintf(line, sizeof(line), "epoch %lld/%lld done: train_loss %.4f (%.2f s)", epoch, total, e.train_loss,
                  e.train_s);
  }
  return line;
}

void log_step(log::RunLog& log, const TrainingPosition& pos, double loss, double lr, double loss_scale,
              double samples_per_s) {
  nlohmann::ordered_json j{{"event", "step"}, {"epoch", pos.epoch + 1}, {"step", pos.step}, {"loss", loss},
                           {"lr", lr}, {"samples_per_s", samples_per_s}, {"skipped_steps", pos.skipped_steps}};
  if (loss_scale > 0) j["loss_scale"] = loss_scale;
  log.event(j);
  log.scalar("train/loss", loss, pos.step);
  log.scalar("train/lr", lr, pos.step);
  log.scalar("train/samples_per_s", samples_per_s, pos.step);
  if (loss_scale > 0) log.scalar("amp/loss_scale", loss_scale, pos.step);
}

void log_epoch(log::RunLog& log, const EpochResult& e, int64_t step) {
  nlohmann::ordered_json j{{"event", "epoch"}, {"epoch", e.epoch}, {"step", step}, {"train_loss", e.train_loss}};
  const bool lm = !std::isnan(e.perplexity);
  if (lm) {
    j["test_loss"] = e.test_loss;
    j["perplexity"] = e.perplexity;
  } else if (!std::isnan(e.test_acc)) {
    j["test_acc"] = e.test_acc;
  }
  j["train_s"] = e.train_s;
  log.event(j);
  if (lm) {
    log.scalar("test/loss", e.test_loss, step);
    log.scalar("test/perplexity", e.perplexity, step);
  } else if (!std::isnan(e.test_acc)) {
    log.scalar("test/accuracy", e.test_acc, step);
  }
}

std::vector<RankFigures> gather_rank_figures(dist::ProcessGroup& group, const StepProfiler& profiler,
                                             const parallel::MemoryReport& memory) {
  const ProfileSummary p = profiler.summary();
  const double sync_ms = p.phases.empty() ? 0.0 : p.phases[static_cast<int>(Phase::kSync)].mean_ms;
  const torch::Tensor mine = torch::tensor({peak_rss_mib(), p.step_mean_ms, sync_ms,
                                            static_cast<double>(memory.activation_bytes)}, torch::kFloat64);
  const std::vector<torch::Tensor> all = group.all_gather(mine);
  std::vector<RankFigures> figures;
  if (group.rank() != 0) return figures;
  for (int64_t r = 0; r < static_cast<int64_t>(all.size()); ++r) {
    const auto* v = all[r].data_ptr<double>();
    figures.push_back({r, v[0], v[1], v[2], static_cast<int64_t>(v[3])});
  }
  return figures;
}

std::string memory_line(int64_t rank, const parallel::MemoryReport& m, double peak_rss_mib, double sent_bytes_per_step) {
  const std::string activations = m.activation_bytes > 0 ? c10::str(", activations held for backward at most ",
      static_cast<double>(m.activation_bytes) / kMiB, " MiB") : "";
  char line[320];
  std::snprintf(line, sizeof(line), "rank %lld memory: parameters %.2f MiB, gradients %.2f MiB, optimizer %.2f MiB "
                "(optimizer state and fp32 master weights)%s, peak RSS %.1f MiB; sent %.2f MiB per step",
                static_cast<long long>(rank), static_cast<double>(m.param_bytes) / kMiB,
                static_cast<double>(m.grad_bytes) / kMiB, static_cast<double>(m.optim_bytes) / kMiB,
                activations.c_str(), peak_rss_mib, sent_bytes_per_step / kMiB);
  return line;
}

}  // namespace lockstep::train
