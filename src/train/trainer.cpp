#include "lockstep/train/trainer.h"

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include "lockstep/core/process.h"
#include "lockstep/core/tensor_memory.h"
#include "lockstep/log/progress.h"
#include "lockstep/models/classifier.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/parallel/checkpoint.h"
#include "lockstep/parallel/sync_batch_norm.h"
#include "class_labels.h"
#include "run_report.h"

namespace lockstep::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

template <typename Result>
void set_evaluation(Result& r, const Evaluation& e) {
  r.test_acc = e.accuracy;
  r.test_loss = e.loss;
  r.perplexity = e.perplexity;
}

}  // namespace

// One training run: epochs of optimizer steps over micro-batches, driven through a
// parallel::Strategy (see Note [The Strategy seam]); logging, evaluation and checkpoints between
// steps.
class Trainer::Loop {
 public:
  Loop(torch::nn::AnyModule model, std::shared_ptr<TrainingData> train_data, TrainerOptions options,
       std::shared_ptr<TrainingData> eval_data)
      : o_(std::move(options)), group_(o_.strategy_options().group().get()), rank_(group_ ? group_->rank() : 0),
        leader_(rank_ == 0), data_(std::move(train_data)), eval_data_(std::move(eval_data)),
        profiler_(StepProfilerOptions().enabled(o_.profile() || !o_.trace().empty())) {
    o_.validate();
    TORCH_CHECK_VALUE(data_ != nullptr, "Trainer: no training data");
    loader_ = std::make_unique<BatchLoader>(data_, o_.loader());
    if (o_.report_memory()) tensor_memory_.emplace();  // strategies that count activations read it
    result_.world_size = group_ ? group_->size() : 1;
    result_.rank = rank_;
    result_.threads = torch::get_num_threads();
    const parallel::StrategyKind kind =
        o_.strategy().value_or(result_.world_size > 1 ? parallel::StrategyKind::kDdp : parallel::StrategyKind::kLocal);
    checkpointer_ = std::make_unique<Checkpointer>(
        CheckpointerOptions(o_.checkpoint()).strategy(parallel::to_string(kind)).reporter(o_.reporter()),
        resume_settings(o_, result_.world_size), group_);

    if (o_.sync_batchnorm() && group_) {
      TORCH_CHECK_VALUE(parallel::convert_sync_batchnorm(model.ptr(), *group_) == model.ptr(),
                        "sync_batchnorm: the model is itself a BatchNorm; wrap it in a module of your own");
    }
    if (o_.checkpoint_activations()) {
      auto* blocks = dynamic_cast<models::Classifier*>(model.ptr().get());
      TORCH_CHECK_VALUE(blocks != nullptr, "checkpoint_activations recomputes the model block by block: derive it ",
                        "from models::Classifier and list its blocks() (see Note [Model blocks])");
      blocks->set_block_runner(parallel::checkpoint_block);
    }
    const std::optional<Checkpoint> checkpoint = checkpointer_->load_resume(o_.epochs());
    // A sharded checkpoint resumed shard by shard holds no full model: restore() loads the shards.
    if (checkpoint && !checkpoint->model.isNone())
      models::load_state_dict(*model.ptr(), checkpoint->model, "checkpoint '" + checkpointer_->resumed_from() + "' model");
    model.ptr()->train();
    parallel::StrategyOptions strategy_options = o_.strategy_options();
    strategy_options.profiler(&profiler_).reporter(o_.reporter());
    if (strategy_options.pipeline().balance() == parallel::PipelineBalance::kTime &&
        !strategy_options.pipeline().balance_input().defined()) {
      // Note [Balancing stages by time]: one pipeline micro-batch of the first training batch.
      const torch::Tensor input = data_->get_batch(data_->batches(epoch_batches(0, 1, 0)).front()).data;
      const int64_t rows = (input.size(0) + strategy_options.pipeline().micro_batches() - 1) /
                           strategy_options.pipeline().micro_batches();
      strategy_options.pipeline().balance_input(input.narrow(0, 0, rows));
    }
    strategy_ = o_.make_strategy() ? o_.make_strategy()(std::move(model), std::move(strategy_options))
                                   : parallel::make_strategy(kind, std::move(model), std::move(strategy_options));
    pos_ = checkpointer_->restore(checkpoint, *strategy_);
    // Each replica of the model (a rank, or a pipeline's stages) reads its share of the data.
    const int64_t ranks_per_replica = strategy_->ranks_per_replica();
    replicas_ = result_.world_size / ranks_per_replica;
    replica_ = rank_ / ranks_per_replica;
    if (o_.lr_schedule()) {
      // Text's bucketed epochs can differ in length; the schedule counts the first's.
      const auto micro_batches = static_cast<int64_t>(data_->batches(epoch_batches(0, replicas_, replica_)).size());
      LrScheduleOptions schedule = *o_.lr_schedule();
      schedule.base_lr(scale_lr(schedule.base_lr(), o_.scale_lr(), replicas_ * o_.accum_steps()));
      if (schedule.total_steps() == 0)
        schedule.total_steps((micro_batches + o_.accum_steps() - 1) / o_.accum_steps() * o_.epochs());
      schedule_.emplace(schedule);
    }
    if (leader_ && checkpointer_->enabled()) data_->save_beside_checkpoints(o_.checkpoint().dir());
    if (leader_)
      log_ = log::RunLog(log::RunLogOptions(o_.log()).append(!checkpointer_->resumed_from().empty()).reporter(o_.reporter()));
    log_.event(run_event(o_, result_, strategy_->name(), checkpointer_->resumed_from()));
  }

  TrainResult fit() {
    // The loader, the log and the run's figures end with the run: a second fit() would dereference
    // the loader (after a stop) or train nothing and return the first result (after the end).
    TORCH_CHECK(!fitted_, "Trainer::fit() has already run on this Trainer and ",
                result_.stopped ? c10::str("stopped as asked at step ", pos_.step, " (epoch ", pos_.epoch + 1, " of ",
                                           o_.epochs(), "); to continue, make a new Trainer on the same "
                                           "checkpoint directory with checkpoint resume \"latest\"")
                                : c10::str("trained all ", o_.epochs(), " epochs (", pos_.step,
                                           " steps); a Trainer fits once: make a new Trainer to train again"));
    fitted_ = true;
    for (; pos_.epoch < o_.epochs(); pos_ = pos_.next_epoch()) {
      train_epoch(data_->batches(epoch_batches(pos_.epoch, replicas_, replica_)));
      // Between epochs the epoch's own checkpoint holds the position.
      if (result_.stopped || (pos_.epoch + 1 < o_.epochs() && stop_agreed())) {
        result_.stopped = true;
        break;
      }
    }
    loader_.reset();  // the workers end with the epochs
    if (result_.stopped) {
      result_.steps = pos_.step;
      if (leader_) log_.close();
      if (group_) group_->barrier();
      return result_;
    }
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
    if (group_) result_.ranks = gather_rank_figures(*group_, profiler_, memory);
    if (!o_.save_model().empty()) {
      const auto weights = strategy_->model_state_dict();  // collective (see Strategy::model_state_dict)
      if (leader_) models::save_state_dict(weights, o_.save_model());
    }
    if (leader_) {
      if (!o_.trace().empty()) profiler_.write_chrome_trace(o_.trace(), rank_);
      result_.peak_rss_mib = peak_rss_mib();
      log_.event(summary_event(result_, profiler_));
      log_.close();
    }
    if (group_) group_->barrier();  // nobody exits (tearing the group down) while rank 0 still writes
    result_.peak_rss_mib = peak_rss_mib();
    return result_;
  }

  parallel::Strategy& strategy() { return *strategy_; }

 private:
  // Trains on this replica's micro-batches of the epoch (see Note [Training data]), from
  // pos_.micro_batch on.
  void train_epoch(const std::vector<std::vector<int64_t>>& batches) {
    const auto micro_batches = static_cast<int64_t>(batches.size());
    const int64_t k = o_.accum_steps();
    std::vector<int64_t> before(micro_batches + 1, 0);  // samples in micro-batches [0, i)
    for (int64_t i = 0; i < micro_batches; ++i) before[i + 1] = before[i] + static_cast<int64_t>(batches[i].size());
    const int64_t n = before.back();
    std::optional<log::Progress> progress;
    if (o_.progress() && leader_)
      progress.emplace(*o_.progress(), o_.progress() == &std::cout && stdout_is_terminal(),
                       "epoch " + std::to_string(pos_.epoch + 1) + "/" + std::to_string(o_.epochs()), n);
    TORCH_CHECK_VALUE(pos_.micro_batch <= micro_batches, "checkpoint '", checkpointer_->resumed_from(),
                      "' position.micro_batch is ", pos_.micro_batch, ", beyond the ", micro_batches,
                      " micro-batches of epoch ", pos_.epoch + 1, ": it was not written for this data");
    const int64_t first = pos_.micro_batch;
    loader_->start(batches, first, pos_.epoch, o_.seed());
    const auto t0 = Clock::now();
    while (pos_.micro_batch < micro_batches) {
      // Groups of k micro-batches start at multiples of k, so a resumed epoch steps where the
      // original did.
      const int64_t begin = pos_.micro_batch, end = std::min(begin + k, micro_batches);
      const double loss = step(batches, begin, end);
      pos_.micro_batch = end;
      {
        auto phase = profiler_.scope(Phase::kLogging);
        if (progress) progress->update(before[end], loss);
        if (pos_.step % o_.log_every() == 0)
          log_step(log_, pos_, loss, strategy_->optimizer().param_groups()[0].options().get_lr(), strategy_->loss_scale(),
                   static_cast<double>((before[end] - before[first]) * replicas_) / seconds_since(t0));
      }
      profiler_.end_step();
      const bool saved = checkpointer_->due(pos_.step) && end < micro_batches;
      if (saved) checkpointer_->save(pos_, *strategy_);
      // An epoch's last step goes on to the epoch's end and its checkpoint; fit() stops after it.
      if (end < micro_batches && stop_agreed()) {
        if (checkpointer_->enabled() && !saved) checkpointer_->save(pos_, *strategy_);
        result_.stopped = true;
        if (progress) progress->finish();
        return;
      }
    }
    if (progress) progress->finish();

    EpochResult er;
    er.epoch = pos_.epoch + 1;
    er.train_s = seconds_since(t0);
    er.train_loss = average(pos_.epoch_steps > 0 ? pos_.epoch_loss_sum / static_cast<double>(pos_.epoch_steps) : NAN);
    set_evaluation(er, evaluate_model());
    result_.train_s += er.train_s;
    result_.samples += (n - before[first]) * replicas_;  // every replica has n (padding)
    result_.epochs.push_back(er);
    if (progress) report(o_.reporter(), ReportKind::kInfo, epoch_line(er, o_.epochs()));
    log_epoch(log_, er, pos_.step);
    if (checkpointer_->enabled()) checkpointer_->save(pos_.next_epoch(), *strategy_);  // this epoch is done
  }

  // One optimizer step over the loader's next micro-batches, the epoch's `batches` [begin, end).
  // Returns the step's loss: the mean over its samples (text: target tokens), as one batch of them
  // would give.
  double step(const std::vector<std::vector<int64_t>>& batches, int64_t begin, int64_t end) {
    std::vector<parallel::MicroBatch> micro_batches;
    {
      auto phase = profiler_.scope(Phase::kData);
      std::vector<int64_t> counts;
      int64_t total = 0;
      for (int64_t i = begin; i < end; ++i) {
        Example batch = loader_->next();  // what is left of the wait when workers build ahead
        counts.push_back(data_->count(batch));
        total += counts.back();
        micro_batches.push_back({std::move(batch.data), std::move(batch.target)});
      }
      for (size_t i = 0; i < counts.size(); ++i)
        micro_batches[i].weight = static_cast<double>(counts[i]) / static_cast<double>(total);
    }
    const int64_t sent_before = group_ ? group_->bytes_sent() : 0;
    double loss = 0.0;
    try {
      loss = strategy_->forward_backward(micro_batches, loss_function());
    } catch (const c10::Error& e) {
      name_bad_label(micro_batches, batches, begin, e);  // See Note [Naming the sample behind a bad label]
      throw;
    }
    if (schedule_) schedule_->apply(strategy_->optimizer(), pos_.step);
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

  // The options' loss, which notes the class count of the logits (B, classes) it is given;
  // inject_nan_step adds a NaN constant on its step and rank, which spoils the loss value but not
  // the gradients: only the ranks' vote can then make the other ranks skip too.
  parallel::LossFunction loss_function() {
    const bool spoil = pos_.step == o_.inject_nan_step() && rank_ == o_.inject_nan_rank();
    return [this, spoil, loss = o_.loss()](const torch::Tensor& out, const torch::Tensor& y) {
      if (out.dim() == 2) classes_ = out.size(1);  // dp's replicas call it on their threads
      return spoil ? loss(out, y) + std::numeric_limits<double>::quiet_NaN() : loss(out, y);
    };
  }

  // After the step's loss failed: when a micro-batch's class-index targets hold a label outside
  // the classes the loss was given, throws naming its sample (Note [Naming the sample behind a bad
  // label]), with `error` after it; else returns, and the caller rethrows `error`.
  void name_bad_label(const std::vector<parallel::MicroBatch>& micro_batches,
                      const std::vector<std::vector<int64_t>>& batches, int64_t begin, const c10::Error& error) const {
    const int64_t classes = classes_.load();
    if (classes <= 0) return;
    const std::string rank = group_ ? c10::str("rank ", rank_, ": ") : "";
    for (size_t i = 0; i < micro_batches.size(); ++i)
      check_labels(micro_batches[i].target, classes, batches[begin + i], "training", rank,
                   c10::str(" (the loss said: ", error.what_without_backtrace(), ")"));
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
    TORCH_CHECK(pos_.consecutive_skips < o_.max_skipped_steps(), "rank ", rank_, ": aborting: ",
                pos_.consecutive_skips, " consecutive steps had a non-finite loss or gradient (the last, step ",
                pos_.step + 1, ": ", why, "); lower the learning rate, clip the gradients' norm, or check the data. ",
                "max_skipped_steps=", o_.max_skipped_steps(), " sets how many in a row are tolerated");
  }

  void report_memory(const parallel::MemoryReport& m) {
    result_.param_bytes = m.param_bytes;
    result_.grad_bytes = m.grad_bytes;
    result_.optim_bytes = m.optim_bytes;
    // See Note [Counting bytes on the wire]: the collectives of forward_backward() and step().
    const double sent = steps_run_ > 0 ? static_cast<double>(bytes_sent_) / static_cast<double>(steps_run_) : 0.0;
    result_.sent_bytes_per_step = static_cast<int64_t>(sent);
    if (o_.report_memory()) report(o_.reporter(), ReportKind::kInfo, memory_line(rank_, m, peak_rss_mib(), sent));
  }

  // The held-out split's figures; what Metric::kAuto chose, when not accuracy, is said once.
  Evaluation evaluate_model() {
    if (!eval_data_) return {};
    Evaluation e = evaluate(strategy_->module(), [this](const torch::Tensor& x) { return strategy_->forward(x); },
                            *eval_data_, o_.loss(), o_.metric(), o_.eval_batch_size(), group_);
    if (leader_ && !metric_said_ && o_.metric() == Metric::kAuto && e.metric != Metric::kAccuracy)
      report(o_.reporter(), ReportKind::kNotice,
             c10::str("held-out metric: the loss only (test_loss), not accuracy: ", e.why,
                      "; set TrainerOptions::metric to choose"));
    metric_said_ = true;
    return e;
  }

  EpochBatches epoch_batches(int64_t epoch, int64_t replicas, int64_t replica) const {
    return {epoch, replicas, replica, o_.batch_size(), o_.seed()};
  }

  // Whether any rank's stop_requested() says stop, agreed by all (see TrainerOptions::stop_requested).
  bool stop_agreed() {
    if (!o_.stop_requested()) return false;
    const double mine = o_.stop_requested()() ? 1.0 : 0.0;
    return average(mine) > 0.0;
  }

  // The mean of `value` over the ranks.
  double average(double value) { return group_ ? group_->average(value) : value; }

  // First: its share of the group outlives everything below (Note [Who keeps the process group alive]).
  TrainerOptions o_;
  dist::ProcessGroup* group_;
  const int64_t rank_;
  const bool leader_;
  std::shared_ptr<TrainingData> data_, eval_data_;
  std::unique_ptr<BatchLoader> loader_;
  std::optional<TensorMemoryCounter> tensor_memory_;  // report_memory
  StepProfiler profiler_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<parallel::Strategy> strategy_;
  int64_t replicas_ = 1;  // data-parallel replicas: world size / strategy's ranks per replica
  int64_t replica_ = 0;   // this rank's replica
  std::optional<LrSchedule> schedule_;
  log::RunLog log_;
  TrainingPosition pos_;
  bool fitted_ = false;  // fit() runs once
  TrainResult result_;
  int64_t bytes_sent_ = 0;  // by this rank's collectives during the steps of this run
  int64_t steps_run_ = 0;
  std::atomic<int64_t> classes_{0};  // the last loss's logits' (B, classes), 0 before the first
  bool metric_said_ = false;         // the metric Metric::kAuto chose is reported once
};

Trainer::Trainer(torch::nn::AnyModule model, std::shared_ptr<TrainingData> train_data, TrainerOptions options,
                 std::shared_ptr<TrainingData> eval_data)
    : loop_(std::make_unique<Loop>(std::move(model), std::move(train_data), std::move(options), std::move(eval_data))) {}
Trainer::~Trainer() = default;
TrainResult Trainer::fit() { return loop_->fit(); }
parallel::Strategy& Trainer::strategy() { return loop_->strategy(); }

}  // namespace lockstep::train
