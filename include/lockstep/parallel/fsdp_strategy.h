#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/models/classifier.h"
#include "lockstep/parallel/fsdp_unit.h"
#include "lockstep/parallel/step_guard.h"
#include "lockstep/parallel/strategy.h"

namespace lockstep::parallel {

// Note [FSDP as a strategy]
// PyTorch's FullyShardedDataParallel with FULL_SHARD: every rank holds 1/N of each unit's
// parameters, of their gradients and of the optimizer state (Note [FSDP units]), so fp32 Adam
// takes 16Psi/N bytes per rank plus the gathered unit in use. The units are the reference
// model's blocks (options.fsdp().min_params() joins consecutive blocks into larger units, as
// size_based_auto_wrap_policy does); a module that is not a models::Classifier is one unit. The
// block runner (Classifier::set_block_runner) gathers a unit before its first block and reshards
// it after its last, so forward() and evaluation gather unit by unit too. The step is ZeRO's on the
// unit shards (Note [Stepping shards]) and needs no all-gather after it: the shards are the
// parameters, and the next forward gathers them. Checkpoints: model_state_dict() gathers the
// units one at a time into the unwrapped model's keys, and the optimizer state is saved in a
// replica's per-parameter layout (Note [Consolidated optimizer state]), so fsdp, ddp, zero1,
// zero2 and local resume each other's checkpoints on any number of ranks; sharded_state_dict()
// saves each rank's shards without gathering (Note [Sharded state]). Buffers (BatchNorm
// statistics) stay per rank, as in ZeRO. Precision: O0 and O1 (autocast; its cast cache keeps the
// bf16 copies of a unit's weights until the forward ends); O2 and O3 are refused. Not combined
// with activation checkpointing (the block runner is FSDP's). Frozen parameters stay whole on
// every rank, outside the units (Note [Frozen parameters]).
class FsdpStrategy : public Strategy {
 public:
  // options.group() is required; options.fsdp() sets the units.
  FsdpStrategy(torch::nn::AnyModule model, StrategyOptions options);
  ~FsdpStrategy() override;

  std::string name() const override { return "fsdp"; }
  double forward_backward(const std::vector<MicroBatch>& micro_batches, const LossFunction& loss) override;
  StepDecision step() override;
  torch::Tensor forward(const torch::Tensor& input) override;
  torch::nn::Module& module() override { return *module_; }
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  double loss_scale() const override;
  // Collective: gathers the units one at a time.
  c10::Dict<std::string, torch::Tensor> model_state_dict() override;
  // Collective: gathers the optimizer state of every shard.
  c10::impl::GenericDict training_state_dict() override;
  void load_training_state_dict(const c10::impl::GenericDict& state, const std::string& source) override;
  // Each unit's parameter shard and optimizer state as this rank holds them; nothing gathered.
  std::optional<ShardedState> sharded_state_dict() override;
  void load_sharded_state_dict(const ShardedState& state, const std::string& source) override;
  // Parameters: the shards plus the largest unit's gathered parameters (held while it runs) plus
  // the frozen parameters, whole (Note [Frozen parameters]); gradients: the shards' (a unit's full
  // gradient is staged while its backward runs, as zero2's buckets are); optimizer: the shards'
  // state.
  MemoryReport memory() const override;

  const std::vector<std::unique_ptr<FsdpUnit>>& units() const { return units_; }

 private:
  // Where a block stands in its unit (blocks without parameters belong to none).
  struct BlockPlace {
    size_t unit = 0;  // index into units_, forward order
    bool first = false, last = false;
  };

  void build_units();
  torch::Tensor run_block(const models::Block& block, const torch::Tensor& x);
  torch::Tensor run_model(const torch::Tensor& x);  // the forward, unit by unit
  void after_unit_forward(size_t unit, const torch::Tensor& output);
  void prefetch(size_t unit);     // Note [FSDP prefetch]: an index past either end does nothing
  void reshard_every_unit();
  std::vector<const FlatParameters*> flats() const;
  std::vector<ShardLayout> layouts() const;
  std::vector<torch::Tensor> shards() const;

  torch::nn::AnyModule model_;
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<models::Classifier> classifier_;  // null: the model is one unit
  StrategyOptions options_;
  dist::ProcessGroup& group_;
  std::unique_ptr<StepProfiler> disabled_profiler_;  // when options name none
  StepProfiler* profiler_;
  std::vector<std::unique_ptr<FsdpUnit>> units_;
  std::map<std::string, BlockPlace> places_;  // by block name
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<amp::Amp> amp_;
  StepGuard guard_;
};

}  // namespace lockstep::parallel
