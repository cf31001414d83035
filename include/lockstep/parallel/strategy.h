#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/amp/grad_scaler.h"
#include "lockstep/amp/opt_level.h"
#include "lockstep/core/report.h"
#include "lockstep/core/step_profiler.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/parallel/pipeline_schedule.h"
#include "lockstep/parallel/sharded_state.h"

namespace lockstep::parallel {

// Note [The Strategy seam]
// A strategy is how one rank holds and steps its part of a model: a full replica (local, ddp),
// shards of the optimizer state, gradients or parameters (ZeRO, FSDP), or a stage of a pipeline.
// The training loop only fetches micro-batches, calls forward_backward() and step(), and decides
// when to log, evaluate and checkpoint; it never asks which strategy it drives. Everything that
// differs between strategies is behind these methods: how micro-batches run and when gradients
// travel, where the optimizer state lives, what a rank saves and how much memory it holds. A new
// strategy is one header/source pair and one line in the registry (strategy_registry.h); a user's
// program passes its own subclass to the same loop through train::TrainerOptions::make_strategy.

// One micro-batch of an optimizer step.
struct MicroBatch {
  torch::Tensor input;   // (B, ...) as the model takes it, fp32
  torch::Tensor target;  // (B) class indices
  // Its share of the step's samples (B / samples in the step): each micro-batch's mean loss is
  // scaled by it, so the accumulated gradient is that of the mean over the whole step.
  double weight = 1.0;
};

// The objective of a micro-batch: output (B, classes) fp32, target (B) -> a 0-dim mean loss.
using LossFunction = std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;
// Builds the optimizer over the parameters a rank updates (all of them, or its shard).
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor> params)>;

// A fresh model of the same architecture, for strategies that hold several copies (dp's replicas);
// its weights are overwritten.
using ModelFactory = std::function<torch::nn::AnyModule()>;

// Note [Who keeps the process group alive]
// A strategy holds its StrategyOptions, and with them a share of the group, for as long as it
// lives; a Trainer holds its TrainerOptions (and its strategy) the same way. So a user's program
// may drop its own handle on the group once the options are built: the group is torn down when
// the last strategy or Trainer that trains over it is destroyed, never under one (c10d's
// ProcessGroup is held by intrusive_ptr for the same reason). init_process_group's unique_ptr
// converts: `std::shared_ptr<dist::ProcessGroup> group = dist::init_process_group();`. A group
// owned elsewhere for longer than the strategy (a test harness's) may be lent through a
// shared_ptr with a no-op deleter; its owner then answers for the lifetime. Inside a strategy, what
// uses the group (DDP's reducer, the scaler, subgroups) refers to it plainly and is declared after
// the options, so it goes first. A model converted to SyncBatchNorm refers to its group without a
// share (SyncBatchNormImpl): once the strategy and the Trainer are gone, such a module runs in
// training mode only while the caller still holds the group.

// A pointer type as TORCH_ARG needs it (a macro's `const T&` of `X*` would point to const).
using StepProfilerPtr = StepProfiler*;

// The fsdp strategy's wrapping (see Note [FSDP units]).
struct FsdpOptions {
  // A unit is the model's consecutive blocks taken together until they hold at least this many
  // parameters (PyTorch's size_based_auto_wrap_policy's min_num_params); 0: one unit per block.
  TORCH_ARG(int64_t, min_params) = 0;
  // Free a unit's full parameters after its forward and gather them again for its backward;
  // false keeps them from forward to the end of its backward (PyTorch's reshard_after_forward).
  TORCH_ARG(bool, reshard_after_forward) = true;
  // Start the all-gather of the unit that runs next while this one computes: in forward the unit
  // after it, in backward the unit before it (PyTorch's forward_prefetch and BACKWARD_PRE). One
  // more unit is gathered at a time. See Note [FSDP prefetch].
  TORCH_ARG(bool, prefetch) = true;
};

// What every built-in strategy does the same way around the step.
struct StrategyOptions {
  TORCH_ARG(OptimizerFactory, optimizer);                  // required
  TORCH_ARG(amp::OptLevel, opt_level) = amp::OptLevel::kO0;
  TORCH_ARG(torch::ScalarType, half_dtype) = torch::kBFloat16;  // O1-O3: kBFloat16 or kHalf
  // Loss scaling; unset: the opt level's own (see amp::initialize).
  TORCH_ARG(c10::optional<amp::GradScalerOptions>, loss_scale) = c10::nullopt;
  // Keep loss_scale's init_scale after every update: Apex's static loss_scale=N (overflowing
  // steps are still skipped).
  TORCH_ARG(bool, fixed_loss_scale) = false;
  TORCH_ARG(double, clip_value) = 0.0;  // clamp each gradient element to [-v, v] first; 0: off
  TORCH_ARG(double, clip_norm) = 0.0;   // then scale to total L2 norm <= n; 0: off
  // The ranks that train together, shared with the caller (Note [Who keeps the process group
  // alive]); null: one process.
  TORCH_ARG(std::shared_ptr<dist::ProcessGroup>, group) = nullptr;
  TORCH_ARG(StepProfilerPtr, profiler) = nullptr;   // phases of the step, when set
  TORCH_ARG(PipelineOptions, pipeline) = {};        // the pipeline strategy's stages and schedule
  TORCH_ARG(FsdpOptions, fsdp) = {};                // the fsdp strategy's units
  // dp: model replicas, one thread each; 0: the intra-op thread count, at least 2.
  TORCH_ARG(int64_t, replicas) = 0;
  TORCH_ARG(ModelFactory, model_factory);           // dp: builds its replicas
  TORCH_ARG(Reporter, reporter) = stdio_reporter();  // what a strategy has to say (Note [Reports])
};

// What every built-in strategy's constructor checks first: an optimizer factory is set and the
// clipping thresholds are finite and >= 0. Throws c10::ValueError naming the value.
void check_strategy_options(const StrategyOptions& options);

// The outcome of Strategy::step().
struct StepDecision {
  bool stepped = false;
  std::string skip_reason;  // when not stepped: what was non-finite, and on which ranks
};

// Bytes this rank holds for training.
struct MemoryReport {
  int64_t param_bytes = 0;  // model parameters (this rank's share when sharded)
  int64_t grad_bytes = 0;   // their gradients, and the fp32 masters' at O2
  int64_t optim_bytes = 0;  // optimizer state, and fp32 master weights at O2
  // The most bytes of activations held for backward at once during a step, for strategies that
  // count them (pipeline) while a TensorMemoryCounter is installed; 0: not counted.
  int64_t activation_bytes = 0;
};

// The bytes `t` holds (numel x element size); 0 for an undefined tensor (no gradient yet).
int64_t tensor_bytes(const torch::Tensor& t);

// See Note [The Strategy seam]. The model's weights are final when a strategy is made (load
// --init-weights or a checkpoint's weights into the fp32 module first): strategies may convert,
// broadcast or shard them. Not thread-safe: one training loop drives it.
class Strategy {
 public:
  virtual ~Strategy() = default;

  virtual std::string name() const = 0;

  // Trains on one optimizer step's micro-batches: zeroes the gradients, then forward, loss and
  // backward of each in turn; gradients are synchronised as the strategy decides. Returns this
  // rank's loss of the step: the sum over micro-batches of weight x loss.
  virtual double forward_backward(const std::vector<MicroBatch>& micro_batches, const LossFunction& loss) = 0;

  // Clips and steps the optimizer, unless the step's loss or gradients were non-finite on any
  // rank, in which case every rank skips it (see Note [Agreeing on non-finite steps]).
  virtual StepDecision step() = 0;

  // The model's output for `input` (fp32) in the strategy's precision, without training it: the
  // caller puts module() in eval mode and holds a NoGradGuard (train::evaluate does both).
  virtual torch::Tensor forward(const torch::Tensor& input) = 0;

  // This rank's module (the whole model for replicas).
  virtual torch::nn::Module& module() = 0;
  // The optimizer: set its learning rate here (it may hold a shard of the parameters).
  virtual torch::optim::Optimizer& optimizer() = 0;
  // The current loss scale, 0 without loss scaling.
  virtual double loss_scale() const = 0;

  // How many consecutive ranks hold one replica of the model and read the same batches: 1 when
  // every rank is a replica (data parallel), the stage count for a pipeline (ranks r*K .. r*K+K-1
  // are replica r's stages). The training loop gives each replica its DistributedSampler share.
  virtual int64_t ranks_per_replica() const { return 1; }

  // What a checkpoint holds, in PyTorch's layouts. The model's fp32 state dict (O2: the masters,
  // not the half copies); Python's load_state_dict accepts it. Collective, like
  // training_state_dict(): every rank calls both, and a strategy whose state is spread over ranks
  // gathers it there; rank 0's result is what is saved.
  virtual c10::Dict<std::string, torch::Tensor> model_state_dict() = 0;
  // {"optimizer": optimizer.state_dict(), "scaler": GradScaler.state_dict() or {}}, the optimizer
  // state in the per-parameter layout of a replica's optimizer whatever the strategy, so that any
  // strategy resumes it. Collective: every rank calls it (sharded strategies gather their state).
  virtual c10::impl::GenericDict training_state_dict() = 0;
  // Restores what training_state_dict() returned; `source` names it in errors.
  virtual void load_training_state_dict(const c10::impl::GenericDict& state, const std::string& source) = 0;

  // The sharded form (Note [Sharded state], PyTorch's SHARDED_STATE_DICT): what this rank holds of
  // the parameters and the optimizer state, as it holds it. Local: nothing is gathered. nullopt
  // for a strategy without shards (every rank a replica, or a pipeline's stages).
  virtual std::optional<ShardedState> sharded_state_dict() { return std::nullopt; }
  // Restores what sharded_state_dict() returned on this rank of a run with the same strategy,
  // world size and units. Collective for strategies whose ranks also keep the full parameters
  // (zero1, zero2 all-gather the loaded shards). The default refuses, naming the strategy.
  virtual void load_sharded_state_dict(const ShardedState& state, const std::string& source);

  virtual MemoryReport memory() const = 0;
};

}  // namespace lockstep::parallel
