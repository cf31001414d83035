#pragma once

#include <torch/arg.h>

#include <memory>

#include "lockstep/parallel/flat_parameters.h"
#include "lockstep/parallel/shard_reducer.h"
#include "lockstep/parallel/step_guard.h"
#include "lockstep/parallel/strategy.h"

namespace lockstep::parallel {

struct ZeroOptions {
  // 1: each rank holds the optimizer state of its shard only (ZeRO-1, PyTorch's
  // ZeroRedundancyOptimizer); 2: its gradient too (ZeRO-2).
  TORCH_ARG(int64_t, stage) = 1;
  TORCH_ARG(double, bucket_cap_mb) = 25.0;  // stage 2: gradients reduce-scattered in buckets of this size
};

// Note [ZeRO stages as a strategy]
// Every rank keeps the whole model (its parameters are views of one flat buffer) and runs forward
// and backward as a replica does; only the step differs (Note [Flat parameters and shards]).
//   Stage 1: backward accumulates full gradients into a flat buffer over the step's micro-batches
//            (the parameters' .grad are views of it); after the last backward one reduce-scatter
//            leaves each rank the average of its shard's range, in place. Memory: 4Psi weights +
//            4Psi gradients + the optimizer's 8Psi/N (Adam). Bytes sent per step per rank:
//            (N-1)/N x 4Psi reduce-scatter + (N-1)/N x 4Psi all-gather, DDP's 2Psi elements.
//   Stage 2: the gradients are reduce-scattered bucket by bucket while backward runs and only the
//            shard's gradient is kept (Note [Reducing gradients into shards]): 4Psi + 12Psi/N.
//            With k micro-batches per step the reduce-scatter runs k times.
// Then both stages decide and clip on the global gradient, step the shard, and all-gather the
// shards into every rank's flat buffer. The optimizer state is written and read in the
// per-parameter layout (Note [Consolidated optimizer state]), so checkpoints move between ddp,
// zero1, zero2 and local and between world sizes. Buffers (BatchNorm statistics) are not
// broadcast each step, as in DeepSpeed and FSDP: use SyncBatchNorm for equal statistics. Frozen
// parameters stay whole outside the flat buffer and are never stepped (Note [Frozen parameters]).
// Precision: O0 and O1 (autocast, loss scaling on the shard); O2 and O3 are refused.
class ZeroStrategy : public Strategy {
 public:
  // options.group() is required.
  ZeroStrategy(torch::nn::AnyModule model, StrategyOptions options, ZeroOptions zero = {});
  ~ZeroStrategy() override;

  std::string name() const override { return zero_.stage() == 1 ? "zero1" : "zero2"; }
  double forward_backward(const std::vector<MicroBatch>& micro_batches, const LossFunction& loss) override;
  StepDecision step() override;
  torch::Tensor forward(const torch::Tensor& input) override;
  torch::nn::Module& module() override { return *module_; }
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  double loss_scale() const override;
  c10::Dict<std::string, torch::Tensor> model_state_dict() override;
  // Collective: gathers the optimizer state of every shard.
  c10::impl::GenericDict training_state_dict() override;
  void load_training_state_dict(const c10::impl::GenericDict& state, const std::string& source) override;
  // This rank's shard of the flat parameters and its optimizer state; nothing gathered.
  std::optional<ShardedState> sharded_state_dict() override;
  // Collective: loads this rank's shard, then all-gathers the shards into every rank's weights.
  void load_sharded_state_dict(const ShardedState& state, const std::string& source) override;
  MemoryReport memory() const override;

  const FlatParameters& flat_parameters() const { return *flat_; }

 private:
  torch::nn::AnyModule model_;
  std::shared_ptr<torch::nn::Module> module_;
  StrategyOptions options_;
  ZeroOptions zero_;
  dist::ProcessGroup& group_;
  std::unique_ptr<StepProfiler> disabled_profiler_;  // when options name none
  StepProfiler* profiler_;
  std::unique_ptr<FlatParameters> flat_;
  torch::Tensor flat_grad_;   // stage 1: (N*S), the parameters' .grad are views of it
  torch::Tensor grad_shard_;  // (S): the shard's .grad (at stage 1 a view of flat_grad_)
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<amp::Amp> amp_;
  std::unique_ptr<ShardReducer> reducer_;  // stage 2
  StepGuard guard_;
};

}  // namespace lockstep::parallel
