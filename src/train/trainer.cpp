#include "lockstep/train/trainer.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <optional>

#include "lockstep/core/heap.h"
#include "lockstep/core/names.h"
#include "lockstep/core/process.h"
#include "lockstep/core/report.h"
#include "lockstep/core/tensor_memory.h"
#include "lockstep/core/world.h"
#include "lockstep/log/progress.h"
#include "lockstep/log/run_log.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/parallel/checkpoint.h"
#include "lockstep/train/checkpointer.h"
#include "lockstep/train/train_data.h"

namespace lockstep::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The JSONL log's first line of a run (and of each resume): what `lockstep report` shows as the
// run's settings.
nlohmann::ordered_json run_event(const TrainOptions& o, const TrainResult& r, const std::string& strategy,
                                 const std::string& resumed_from) {
  const optim::OptimizerOptions opt = o.optimizer_options();
  nlohmann::ordered_json s{{"model", o.model()}, {"data", enum_name(data_source_names(), o.data())},
                           {"limit", o.limit()}, {"epochs", o.epochs()}, {"batch_size", o.batch_size()},
                           {"world_size", r.world_size}, {"threads", r.threads}, {"strategy", strategy},
                           {"optimizer", optim::to_string(o.optimizer())}, {"lr", opt.lr()},
                           {"lr_schedule", enum_name(lr_schedule_names(), o.lr_schedule())}, {"warmup_steps", o.warmup_steps()},
                           {"precision", enum_name(precision_names(), o.precision())},
                           {"opt_level", amp::to_string(o.resolved_opt_level())},
                           {"loss_scale", o.resolved_loss_scale()}, {"accum_steps", o.accum_steps()},
                           {"clip_value", o.clip_value()}, {"clip_norm", o.clip_norm()}, {"sync_bn", o.sync_bn()},
                           {"seed", o.seed()}};
  nlohmann::ordered_json j{{"event", "run"}, {"settings", std::move(s)}};
  if (!resumed_from.empty()) j["resumed_from"] = resumed_from;
  return j;
}

// The JSONL log's last line: the summary `lockstep train` prints, rank 0's memory breakdown and,
// with --profile, the per-phase step profile.
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

// One training run: epochs of optimizer steps over micro-batches, driven through a
// parallel::Strategy (see Note [The Strategy seam]); logging, evaluation and checkpoints between
// steps. train() below runs it.
class TrainingRun {
 public:
  explicit TrainingRun(const TrainOptions& o)
      : o_(o), world_(world_from_env()), leader_(world_.rank == 0),
        profiler_(StepProfilerOptions().enabled(o.profile() || !o.trace().empty())) {
    configure_heap();  // See Note [Keeping freed memory for the next step]
    result_.threads = o.threads() > 0 ? o.threads() : default_intra_op_threads();
    torch::set_num_threads(static_cast<int>(result_.threads));
    if (o.report_memory()) tensor_memory_.emplace();  // strategies that count activations read it
    torch::manual_seed(o.seed());
    if (o.deterministic()) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    if (world_.world_size > 1)
      group_ = dist::init_process_group(dist::InitOptions().timeout(
          std::chrono::milliseconds(static_cast<int64_t>(std::llround(o.timeout() * 1000.0)))));
    result_.world_size = world_.world_size;
    result_.rank = world_.rank;

    data_ = make_train_data(o, group_.get());
    checkpointer_ = std::make_unique<Checkpointer>(
        CheckpointerOptions().dir(o.checkpoint_dir()).save_every(o.save_every()).keep_last(o.keep_last()).resume(o.resume())
            .format(o.checkpoint_format()).strategy(parallel::to_string(o.resolved_strategy(world_.world_size)))
            .reporter(o.reporter()),
        o.run_settings(world_.world_size), group_.get());

    // The weights are final before the strategy converts, broadcasts or shards them.
    auto model = data_->make_model(o, group_.get(), /*initial_weights=*/true);
    if (o.checkpoint_activations()) model->set_block_runner(parallel::checkpoint_block);
    const std::optional<Checkpoint> checkpoint = checkpointer_->load_resume(o.epochs());
    // A sharded checkpoint resumed shard by shard holds no full model: restore() loads the shards.
    if (checkpoint && !checkpoint->model.isNone())
      models::load_state_dict(*model, checkpoint->model, "checkpoint '" + checkpointer_->resumed_from() + "' model");
    model->train();
    auto strategy_options = o.strategy_options(group_.get(), &profiler_);
    if (o.balance() == parallel::PipelineBalance::kTime) {  // validate(): only with --strategy pipeline
      // Note [Balancing stages by time]: one pipeline micro-batch of the first training batch.
      const torch::Tensor input = data_->micro_batch(data_->micro_batches(0, 1, 0).front()).first.input;
      const int64_t rows = (input.size(0) + o.micro_batches() - 1) / o.micro_batches();
      strategy_options.pipeline().balance_input(input.narrow(0, 0, rows));
    }
    strategy_options.model_factory([&o, data = data_.get(), group = group_.get()] {
      return torch::nn::AnyModule(data->make_model(o, group, /*initial_weights=*/false));
    });
    strategy_ = parallel::make_strategy(o.resolved_strategy(world_.world_size), torch::nn::AnyModule(model),
                                        std::move(strategy_options));
    pos_ = checkpointer_->restore(checkpoint, *strategy_);
    // Each replica of the model (a rank, or a pipeline's stages) reads its share of the data.
    const int64_t ranks_per_replica = strategy_->ranks_per_replica();
    replicas_ = world_.world_size / ranks_per_replica;
    replica_ = world_.rank / ranks_per_replica;
    // Text's bucketed epochs can differ in length; the schedule counts the first's.
    const auto micro_batches = static_cast<int64_t>(data_->micro_batches(0, replicas_, replica_).size());
    schedule_ = std::make_unique<LrSchedule>(o.lr_schedule_options(replicas_, micro_batches));
    if (leader_ && checkpointer_->enabled()) data_->save_beside_checkpoints(o.checkpoint_dir());
    if (leader_)
      log_ = log::RunLog(log::RunLogOptions().jsonl(o.log_jsonl()).append(!checkpointer_->resumed_from().empty())
                             .tensorboard(o.tensorboard()).reporter(o.reporter()));
    log_.event(run_event(o, result_, strategy_->name(), checkpointer_->resumed_from()));
  }

  TrainResult run() {
    for (; pos_.epoch < o_.epochs(); pos_ = pos_.next_epoch())
      train_epoch(data_->micro_batches(pos_.epoch, replicas_, replica_));
    if (result_.epochs.empty()) {  // resumed from a finished run: its model is evaluated and written as is
      set_evaluation(result_, evaluate_model());
      result_.final_loss = NAN;
    } else {
      result_.samples_per_s = average(static_cast<double>(result_.samples) / result_.train_s);  // smooths rank jitter
      const EpochResult& last = result_.epochs.back();
      result_.test_acc = last.test_acc;
      result_.test_loss = last.test_loss;
      result_.perplexity = last.perplexity;
      result_.final_loss = last.train_loss;
    }
    for (const auto& [key, value] : data_->figures()) result_.figures.emplace_back(key, average(value));
    result_.steps = pos_.step;
    result_.skipped_steps = pos_.skipped_steps;
    const parallel::MemoryReport memory = strategy_->memory();
    report_memory(memory);
    if (profiler_.enabled()) result_.profile = profiler_.report();
    if (group_) gather_rank_figures(memory);
    if (!o_.save_model().empty()) {
      const auto weights = strategy_->model_state_dict();  // collective (see Strategy::model_state_dict)
      if (leader_) models::save_state_dict(weights, o_.save_model());
    }
    if (leader_) {
      if (!o_.trace().empty()) profiler_.write_chrome_trace(o_.trace(), world_.rank);
      result_.peak_rss_mib = peak_rss_mib();
      log_.event(summary_event(result_, profiler_));
      log_.close();
    }
    if (group_) group_->barrier();  // nobody exits (tearing the group down) while rank 0 still writes
    result_.peak_rss_mib = peak_rss_mib();
    return result_;
  }

 private:
  // Trains on this replica's micro-batches of the epoch (see Note [Training data]), from
  // pos_.micro_batch on.
  void train_epoch(const std::vector<std::vector<int64_t>>& batches) {
    const auto micro_batches = static_cast<int64_t>(batches.size());
    const int64_t k = o_.accum_steps();
    std::vector<int64_t> before(micro_batches + 1, 0);  // samples in micro-batches [0, i)
    for (int64_t i = 0; i < micro_batches; ++i) before[i + 1] = before[i] + static_cast<int64_t>(batches[i].size());
    const int64_t n = before.back();
    const bool show = o_.progress() && leader_;
    log::Progress progress(std::cout, stdout_is_terminal(),
                           "epoch " + std::to_string(pos_.epoch + 1) + "/" + std::to_string(o_.epochs()), n);
    const int64_t first = std::min(pos_.micro_batch, micro_batches);
    const auto t0 = Clock::now();
    while (pos_.micro_batch < micro_batches) {
      // Groups of k micro-batches start at multiples of k, so a resumed epoch steps where the
      // original did.
      const int64_t begin = pos_.micro_batch, end = std::min(begin + k, micro_batches);
      const double loss = step(batches, begin, end);
      pos_.micro_batch = end;
      {
        auto phase = profiler_.scope(Phase::kLogging);
        if (show) progress.update(before[end], loss);
        if (pos_.step % o_.log_every() == 0)
          log_step(loss, static_cast<double>((before[end] - before[first]) * replicas_) / seconds_since(t0));
      }
      profiler_.end_step();
      if (checkpointer_->due(pos_.step) && end < micro_batches) checkpointer_->save(pos_, *strategy_);
    }
    if (show) progress.finish();

    EpochResult er;
    er.epoch = pos_.epoch + 1;
    er.train_s = seconds_since(t0);
    er.train_loss = average(pos_.epoch_steps > 0 ? pos_.epoch_loss_sum / static_cast<double>(pos_.epoch_steps) : NAN);
    set_evaluation(er, evaluate_model());
    result_.train_s += er.train_s;
    result_.samples += (n - before[first]) * replicas_;  // every replica has n (padding)
    result_.epochs.push_back(er);
    const bool lm = !std::isnan(er.perplexity);
    if (show) {
      char line[160];
      if (lm) {
        std::snprintf(line, sizeof(line), "epoch %lld/%lld done: train_loss %.4f test_loss %.4f perplexity %.2f (%.2f s)",
                      static_cast<long long>(er.epoch), static_cast<long long>(o_.epochs()), er.train_loss,
                      er.test_loss, er.perplexity, er.train_s);
      } else {
        std::snprintf(line, sizeof(line), "epoch %lld/%lld done: train_loss %.4f test_acc %.4f (%.2f s)",
                      static_cast<long long>(er.epoch), static_cast<long long>(o_.epochs()), er.train_loss, er.test_acc,
                      er.train_s);
      }
      report(o_.reporter(), ReportKind::kInfo, line);
    }
    nlohmann::ordered_json epoch{{"event", "epoch"}, {"epoch", er.epoch}, {"step", pos_.step}, {"train_loss", er.train_loss}};
    if (lm) {
      epoch["test_loss"] = er.test_loss;
      epoch["perplexity"] = er.perplexity;
    } else {
      epoch["test_acc"] = er.test_acc;
    }
    epoch["train_s"] = er.train_s;
    log_.event(epoch);
    if (lm) {
      log_.scalar("test/loss", er.test_loss, pos_.step);
      log_.scalar("test/perplexity", er.perplexity, pos_.step);
    } else {
      log_.scalar("test/accuracy", er.test_acc, pos_.step);
    }
    if (checkpointer_->enabled()) checkpointer_->save(pos_.next_epoch(), *strategy_);  // this epoch is done
  }

  // One optimizer step over micro-batches [begin, end) of `batches`. Returns the step's loss: the
  // mean over its samples (text: target tokens), as one batch of them would give.
  double step(const std::vector<std::vector<int64_t>>& batches, int64_t begin, int64_t end) {
    std::vector<parallel::MicroBatch> micro_batches;
    {
      auto phase = profiler_.scope(Phase::kData);
      std::vector<int64_t> counts;
      int64_t total = 0;
      for (int64_t i = begin; i < end; ++i) {
        auto [micro_batch, count] = data_->micro_batch(batches[i]);
        micro_batches.push_back(std::move(micro_batch));
        counts.push_back(count);
        total += count;
      }
      for (size_t i = 0; i < counts.size(); ++i)
        micro_batches[i].weight = static_cast<double>(counts[i]) / static_cast<double>(total);
    }
    const int64_t sent_before = group_ ? group_->bytes_sent() : 0;
    const double loss = strategy_->forward_backward(micro_batches, loss_function());
    schedule_->apply(strategy_->optimizer(), pos_.step);
    const parallel::StepDecision decision = strategy_->step();
    if (group_) bytes_sent_ += group_->bytes_sent() - sent_before;
    ++steps_run_;
    if (decision.stepped) {
      pos_.consecutive_skips = 0;
      pos_.epoch_loss_sum += loss;
      ++pos_.epoch_steps;
    } else {
      count_skip(decision.skip_reason);
    }
    ++pos_.step;
    result_.step_losses.push_back(loss);
    return loss;
  }

  // The data's cross-entropy; --inject-nan adds a NaN constant on its step and rank, which spoils
  // the loss value but not the gradients: only the ranks' vote can then make the other ranks skip too.
  parallel::LossFunction loss_function() const {
    const TrainData* data = data_.get();
    if (pos_.step != o_.inject_nan_step() || world_.rank != o_.inject_nan_rank())
      return [data](const torch::Tensor& out, const torch::Tensor& y) { return data->loss(out, y); };
    return [data](const torch::Tensor& out, const torch::Tensor& y) {
      return data->loss(out, y) + std::numeric_limits<double>::quiet_NaN();
    };
  }

  // A step skipped on every rank (see Note [Agreeing on non-finite steps]) is counted and logged;
  // max_skipped_steps in a row abort the run.
  void count_skip(const std::string& why) {
    ++pos_.skipped_steps;
    ++pos_.consecutive_skips;
    if (leader_)
      report(o_.reporter(), ReportKind::kNotice,
             c10::str("step ", pos_.step + 1, " skipped: ", why, " (", pos_.skipped_steps, " skipped so far)"));
    log_.event({{"event", "skipped_step"}, {"epoch", pos_.epoch + 1}, {"step", pos_.step + 1}, {"reason", why},
                {"skipped_steps", pos_.skipped_steps}});
    TORCH_CHECK(pos_.consecutive_skips < o_.max_skipped_steps(), "rank ", world_.rank, ": aborting: ",
                pos_.consecutive_skips, " consecutive steps had a non-finite loss or gradient (the last, step ",
                pos_.step + 1, ": ", why, "); lower --lr, set --clip-norm, or check the data. --max-skipped-steps=",
                o_.max_skipped_steps(), " sets how many in a row are tolerated");
  }

  void log_step(double loss, double samples_per_s) {
    const double lr = strategy_->optimizer().param_groups()[0].options().get_lr();
    const double scale = strategy_->loss_scale();
    nlohmann::ordered_json j{{"event", "step"}, {"epoch", pos_.epoch + 1}, {"step", pos_.step}, {"loss", loss},
                             {"lr", lr}, {"samples_per_s", samples_per_s}, {"skipped_steps", pos_.skipped_steps}};
    if (scale > 0) j["loss_scale"] = scale;
    log_.event(j);
    log_.scalar("train/loss", loss, pos_.step);
    log_.scalar("train/lr", lr, pos_.step);
    log_.scalar("train/samples_per_s", samples_per_s, pos_.step);
    if (scale > 0) log_.scalar("amp/loss_scale", scale, pos_.step);
  }

  void report_memory(const parallel::MemoryReport& m) {
    result_.param_bytes = m.param_bytes;
    result_.grad_bytes = m.grad_bytes;
    result_.optim_bytes = m.optim_bytes;
    // See Note [Counting bytes on the wire]: the collectives of forward_backward() and step().
    const double sent = steps_run_ > 0 ? static_cast<double>(bytes_sent_) / static_cast<double>(steps_run_) : 0.0;
    result_.sent_bytes_per_step = static_cast<int64_t>(sent);
    if (!o_.report_memory()) return;
    const std::string activations = m.activation_bytes > 0 ? c10::str(", activations held for backward at most ",
        static_cast<double>(m.activation_bytes) / kMiB, " MiB") : "";
    char line[320];
    std::snprintf(line, sizeof(line), "rank %lld memory: parameters %.2f MiB, gradients %.2f MiB, optimizer %.2f MiB "
                  "(optimizer state and fp32 master weights)%s, peak RSS %.1f MiB; sent %.2f MiB per step",
                  static_cast<long long>(world_.rank), static_cast<double>(m.param_bytes) / kMiB,
                  static_cast<double>(m.grad_bytes) / kMiB, static_cast<double>(m.optim_bytes) / kMiB,
                  activations.c_str(), peak_rss_mib(), sent / kMiB);
    report(o_.reporter(), ReportKind::kInfo, line);
  }

  // Every rank's peak RSS, step and sync times and activation bytes, into rank 0's result.
  void gather_rank_figures(const parallel::MemoryReport& memory) {
    const ProfileSummary p = profiler_.summary();
    const double sync_ms = p.phases.empty() ? 0.0 : p.phases[static_cast<int>(Phase::kSync)].mean_ms;
    const torch::Tensor mine = torch::tensor({peak_rss_mib(), p.step_mean_ms, sync_ms,
                                              static_cast<double>(memory.activation_bytes)}, torch::kFloat64);
    const std::vector<torch::Tensor> all = group_->all_gather(mine);
    if (!leader_) return;
    for (int64_t r = 0; r < static_cast<int64_t>(all.size()); ++r) {
      const auto* v = all[r].data_ptr<double>();
      result_.ranks.push_back({r, v[0], v[1], v[2], static_cast<int64_t>(v[3])});
    }
  }

  Evaluation evaluate_model() {
    return data_->evaluate(strategy_->module(), [this](const torch::Tensor& x) { return strategy_->forward(x); },
                           group_.get());
  }

  template <typename Result>
  static void set_evaluation(Result& r, const Evaluation& e) {
    r.test_acc = e.accuracy;
    r.test_loss = e.loss;
    r.perplexity = e.perplexity;
  }

  // The mean of `value` over the ranks.
  double average(double value) { return group_ ? group_->average(value) : value; }

  const TrainOptions& o_;
  std::optional<TensorMemoryCounter> tensor_memory_;  // --report-memory
  const WorldInfo world_;
  const bool leader_;
  StepProfiler profiler_;
  std::unique_ptr<dist::ProcessGroup> group_;
  std::unique_ptr<TrainData> data_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<parallel::Strategy> strategy_;
  int64_t replicas_ = 1;  // data-parallel replicas: world size / strategy's ranks per replica
  int64_t replica_ = 0;   // this rank's replica
  std::unique_ptr<LrSchedule> schedule_;
  log::RunLog log_;
  TrainingPosition pos_;
  TrainResult result_;
  int64_t bytes_sent_ = 0;  // by this rank's collectives during the steps of this run
  int64_t steps_run_ = 0;
};

}  // namespace

TrainResult train(const TrainOptions& options) {
  options.validate();
  if (world_from_env().rank == 0) options.check_output_paths();  // rank 0 writes them
  return TrainingRun(options).run();
}

}  // namespace lockstep::train
