#pragma once
// Your torch::nn::Module on your data under any strategy and precision: what accelerate's
// Accelerator and Lightning's Trainer are to a Python user.
//
//   std::shared_ptr<lockstep::dist::ProcessGroup> group =
//       lockstep::dist::init_process_group();  // under lockstep run, torchrun, srun, mpirun
//   auto options = lockstep::train::TrainerOptions()
//       .strategy(lockstep::parallel::StrategyKind::kZero2)
//       .strategy_options(lockstep::parallel::StrategyOptions().optimizer(make_sgd).group(group))
//       .epochs(3).batch_size(32);
//   lockstep::train::TrainResult r =
//       lockstep::train::Trainer(torch::nn::AnyModule(MyNet()), train_split, options, test_split).fit();

#include <ATen/core/Dict.h>
#include <c10/util/Optional.h>
#include <nlohmann/json.hpp>
#include <torch/arg.h>
#include <torch/nn/modules/container/any.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "lockstep/core/report.h"
#include "lockstep/log/run_log.h"
#include "lockstep/parallel/strategy.h"
#include "lockstep/parallel/strategy_registry.h"
#include "lockstep/train/batch_loader.h"
#include "lockstep/train/checkpointer.h"
#include "lockstep/train/evaluate.h"
#include "lockstep/train/lr_schedule.h"
#include "lockstep/train/result.h"
#include "lockstep/train/training_data.h"

namespace lockstep::train {

// Builds a strategy of the user's own (a parallel::Strategy subclass) in place of a built-in one.
using StrategyFactory =
    std::function<std::unique_ptr<parallel::Strategy>(torch::nn::AnyModule model, parallel::StrategyOptions options)>;

// A pointer type as TORCH_ARG needs it (see parallel::StepProfilerPtr).
using OstreamPtr = std::ostream*;

// cross_entropy(output, target): a classifier's loss, PyTorch's default reduction (the mean).
torch::Tensor cross_entropy_loss(const torch::Tensor& output, const torch::Tensor& target);

// How a Trainer runs: each component's own options, and the loop's.
struct TrainerOptions {
  // The strategy (see Note [The Strategy seam]); unset: ddp when the group has several ranks,
  // local otherwise. `strategy_options` carries the optimizer, precision, clipping, the process
  // group and the strategies' own settings; the Trainer sets its profiler and reporter. `make_strategy`, when
  // set, builds the strategy instead of parallel::make_strategy (a user's own subclass). The Trainer
  // keeps a share of the group until it is destroyed (Note [Who keeps the process group alive]).
  TORCH_ARG(c10::optional<parallel::StrategyKind>, strategy) = c10::nullopt;
  TORCH_ARG(parallel::StrategyOptions, strategy_options);
  TORCH_ARG(StrategyFactory, make_strategy);
  // Checkpoints and resume; the Trainer fills in the strategy's name.
  TORCH_ARG(CheckpointerOptions, checkpoint);
  // What a checkpoint must share with this run to be resumed by it (check_same_run); empty: world
  // size, batch size, accum_steps and seed.
  TORCH_ARG(c10::impl::GenericDict, run_settings) = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  // The learning rate by optimizer step; unset: the optimizer's own, untouched. total_steps 0: the
  // run's (epochs x steps per epoch). base_lr is scaled by `scale_lr` with factor replicas x
  // accum_steps first.
  TORCH_ARG(c10::optional<LrScheduleOptions>, lr_schedule) = c10::nullopt;
  TORCH_ARG(LrScaleRule, scale_lr) = LrScaleRule::kNone;
  // JSON lines and TensorBoard (rank 0; a resumed run appends). `settings`: what the log's first
  // line records of the run (lockstep report shows it); empty: the Trainer's own figures.
  TORCH_ARG(log::RunLogOptions, log);
  TORCH_ARG(nlohmann::ordered_json, settings) = nlohmann::ordered_json::object();

  // Polled after every optimizer step: when it returns true on any rank, every rank stops at that
  // step boundary, the position is checkpointed there (with checkpoints on), and fit() returns with
  // TrainResult::stopped. The ranks agree on it with one small all-reduce per step, so leave it
  // unset unless a stop may come (lockstep train sets it under an elastic launcher, for SIGTERM).
  TORCH_ARG(std::function<bool()>, stop_requested);

  TORCH_ARG(int64_t, epochs) = 1;
  TORCH_ARG(int64_t, batch_size) = 100;   // samples per micro-batch and replica
  TORCH_ARG(int64_t, accum_steps) = 1;    // micro-batches per optimizer step (DDP no_sync on all but the last)
  TORCH_ARG(uint64_t, seed) = 0;          // of the data order and the data's random transforms
  // Training batches built on worker threads ahead of the step (see Note [Background loading]).
  TORCH_ARG(LoaderOptions, loader);
  TORCH_ARG(parallel::LossFunction, loss) = cross_entropy_loss;
  // The held-out split's measure (see Metric) and its batch. kAuto: accuracy where the targets are
  // class indices of logits of 2 or more classes, else the held-out loss only (TrainResult's
  // test_loss; test_acc NaN), said once through the reporter. kAccuracy where it cannot apply (a
  // regression's float targets, a one-column output) is refused at the first evaluation.
  TORCH_ARG(Metric, metric) = Metric::kAuto;
  TORCH_ARG(int64_t, eval_batch_size) = 200;
  // Every BatchNorm of the model becomes a SyncBatchNorm over the strategy's group before training
  // (parallel::convert_sync_batchnorm; Lightning's sync_batchnorm=True). One process without a
  // group has nothing to synchronise: its BatchNorm already sees the whole batch.
  TORCH_ARG(bool, sync_batchnorm) = false;
  // Every block of the model (a models::Classifier) runs under activation checkpointing.
  TORCH_ARG(bool, checkpoint_activations) = false;
  TORCH_ARG(int64_t, max_skipped_steps) = 10;  // consecutive non-finite steps before aborting
  TORCH_ARG(int64_t, log_every) = 10;          // optimizer steps between logged steps
  TORCH_ARG(std::string, save_model) = "";     // final state dict (rank 0), readable by torch.load
  TORCH_ARG(bool, profile) = false;            // per-phase step times into TrainResult::profile
  TORCH_ARG(std::string, trace) = "";          // Chrome trace of the step phases (rank 0)
  TORCH_ARG(bool, report_memory) = false;      // every rank reports its memory breakdown
  // The progress display (rank 0), and each epoch's closing line through the reporter; null:
  // neither. A terminal gets a line redrawn in place.
  TORCH_ARG(OstreamPtr, progress) = nullptr;
  // Epoch lines, skipped steps, memory lines, and the checkpointer's, the log's and the strategy's
  // reports (Note [Reports]): the Trainer passes it to each.
  TORCH_ARG(Reporter, reporter) = stdio_reporter();
  // Testing: the loss value of step inject_nan_step (0-based) is NaN on rank inject_nan_rank.
  TORCH_ARG(int64_t, inject_nan_step) = -1;
  TORCH_ARG(int64_t, inject_nan_rank) = 0;

 public:
  // Throws c10::ValueError naming the first invalid value.
  void validate() const;
};

// Trains a model on a training split through a strategy, evaluating a held-out split after each
// epoch, with checkpoints, exact resume, logs and the profiler as `options` say (see Note [The
// Strategy seam], Note [Training data]). The loop never asks which strategy it drives. With a
// process group of several ranks, every rank makes a Trainer and calls fit(); each replica trains
// on its DistributedSampler share, losses and accuracy are averaged over ranks, and only rank 0
// shows progress and writes files.
class Trainer {
 public:
  // `model`'s weights are final here (the strategy may convert, broadcast or shard them); a
  // checkpoint resumed is loaded into it first. Strategies that need the model's blocks (fsdp's
  // units, pipeline stages, activation checkpointing) take a models::Classifier (a
  // models::TorchScriptModule is one). Collective: joins
  // the checkpoint restore and the strategy's setup. `eval_data` null: no evaluation.
  Trainer(torch::nn::AnyModule model, std::shared_ptr<TrainingData> train_data, TrainerOptions options,
          std::shared_ptr<TrainingData> eval_data = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Runs the epochs left (all, or those after the resumed checkpoint's position). Collective.
  TrainResult fit();

  // The strategy the model trains under: its module, optimizer, state dicts.
  parallel::Strategy& strategy();

 private:
  class Loop;
  std::unique_ptr<Loop> loop_;
};

}  // namespace lockstep::train
