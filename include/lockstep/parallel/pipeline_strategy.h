#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "lockstep/models/classifier.h"
#include "lockstep/parallel/strategy.h"

namespace lockstep::parallel {

class TiedGradients;  // pipeline_placement.h

// Note [Pipeline strategy]
// GPipe / PipeDream-Flush over ranks: the model's blocks (Note [Model blocks]) are cut into K
// contiguous stages (balanced by parameter count, or PipelineOptions::split), rank r runs stage
// r mod K, and each of the loop's micro-batches is split into M pipeline micro-batches that flow
// through the stages in the order Note [Pipeline schedules] gives. Activations travel forward and
// their gradients backward by point-to-point send/recv between neighbouring ranks (sends are
// asynchronous and waited on at the end of the step, so no schedule can deadlock on them; each
// transfer has its own tag). The loss is computed on the last stage; its value reaches every rank
// by one all-reduce, so the training loop logs it as any strategy's. After the step's last
// backward every stage clips (the norm over all stages, one all-reduce) and steps its own
// optimizer, or every stage skips the step when the loss or a gradient anywhere is non-finite.
//
// Every rank holds the whole model (rank 0's weights at construction) and trains its stage's
// part; a weight two stages use (gpt-mini's tied embedding) is owned by the first and replicated
// on the other, their gradients summed after each backward (Note [Tied weights across stages]).
// Evaluation and state dicts first bring every stage's current weights and buffers to every
// rank (a broadcast per tensor, once after each step that changed them), then run or read the
// whole model locally: checkpoints and --save-model hold the usual keys, and a checkpoint's
// optimizer state is gathered into the whole model's numbering, so it resumes under ddp and
// the reverse.
//
// BatchNorm normalises each pipeline micro-batch with its own statistics and updates the running
// statistics once per micro-batch, as GPipe and torch.distributed.pipeline.sync.Pipe do without
// DeferredBatchNorm: a pipelined step computes exactly what one process computes by gradient
// accumulation over the same M micro-batches (the strategy tests check this).
//
// Note [Pipeline replicas]
// With N = R x K ranks the pipeline runs R data-parallel replicas: ranks rK .. rK+K-1 are replica
// r's stages (Strategy::ranks_per_replica), and the training loop gives each replica its own
// DistributedSampler share. Stage s's R copies form one subgroup (ranks s, s+K, ...; see Note
// [Subgroups]); after the step's last backward each stage averages its gradients over that
// subgroup in one flat all-reduce, so every replica steps with the gradient of the global batch,
// as DDP does. Before each step every stage's BatchNorm buffers are broadcast from replica 0 in the
// same subgroup (DDP's broadcast_buffers): all replicas normalise alike in evaluation and save
// replica 0's running statistics. Send/recv stay between neighbours of one replica, whose ranks
// differ by one. The step's loss is the mean over replicas of each replica's last stage.
//
// The profiler's sync phase holds the time this rank waits to receive a neighbour's activations or
// gradients (its idle time in the bubble) and the replicas' gradient all-reduce. With a
// TensorMemoryCounter installed, the strategy counts the bytes each forward leaves allocated on
// its thread until that micro-batch's backward: MemoryReport::activation_bytes is their most at
// once (see Note [Counting tensor bytes]).
//
// fp32 only (opt level O0). The world size must be a multiple of K.
class PipelineStrategy : public Strategy {
 public:
  // Throws before any communication for a model that does not list its blocks, more stages than
  // blocks, a bad split, a world size that K does not divide, or an opt level other than O0.
  PipelineStrategy(torch::nn::AnyModule model, StrategyOptions options);
  ~PipelineStrategy() override;

  std::string name() const override { return "pipeline"; }
  double forward_backward(const std::vector<MicroBatch>& micro_batches, const LossFunction& loss) override;
  StepDecision step() override;
  torch::Tensor forward(const torch::Tensor& input) override;
  torch::nn::Module& module() override { return *model_; }
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  double loss_scale() const override { return 0.0; }
  int64_t ranks_per_replica() const override { return stages_; }
  c10::Dict<std::string, torch::Tensor> model_state_dict() override;
  c10::impl::GenericDict training_state_dict() override;
  void load_training_state_dict(const c10::impl::GenericDict& state, const std::string& source) override;
  MemoryReport memory() const override;

  int64_t stage() const { return stage_; }
  int64_t stages() const { return stages_; }
  // This stage's blocks: [first, last) of the model's blocks().
  std::pair<int64_t, int64_t> block_range() const { return {first_block_, last_block_}; }
  // The most pipeline micro-batches whose activations this stage held at once, over all steps.
  int64_t peak_live_micro_batches() const { return peak_live_; }
  // Seconds this stage spent blocked receiving activations or gradients, over all steps: its idle
  // time in the pipeline's bubble (and in waiting on slower neighbours).
  double receive_wait_seconds() const { return receive_wait_s_; }
  // Data-parallel copies of the pipeline: world size / K.
  int64_t replicas() const { return replicas_; }

 private:
  struct InFlight;
  torch::Tensor run_stage(torch::Tensor x);
  // The replicas' shares of the step: buffers from replica 0 before, gradients averaged after.
  void broadcast_buffers();
  void average_gradients();
  void send_activation(const torch::Tensor& y, int64_t micro_batch);
  torch::Tensor receive_activation(int64_t micro_batch);
  void receive(torch::Tensor& tensor, int64_t peer, int64_t tag, const std::string& what);
  // Brings every stage's weights and buffers to every rank, when a step changed them.
  void sync_whole_model();
  // The defined gradients of params_[0, count): count = owned_ for the parameters this stage owns.
  std::vector<torch::Tensor> gradients(int64_t count) const;

  std::shared_ptr<models::Classifier> model_;
  StrategyOptions options_;
  dist::ProcessGroup* group_;
  std::unique_ptr<dist::ProcessGroup> stage_group_;  // this stage's replicas, when there are several
  std::unique_ptr<StepProfiler> disabled_profiler_;  // when options name none
  StepProfiler* profiler_;
  std::vector<models::Block> blocks_;
  std::vector<int64_t> first_block_of_stage_;  // K + 1 entries: stage s runs [v[s], v[s+1])
  int64_t stages_ = 1, stage_ = 0, rank_ = 0, replicas_ = 1;
  int64_t first_block_ = 0, last_block_ = 0;
  int64_t first_param_ = 0;  // index of this stage's first owned parameter in model_->parameters()
  // What the optimizer trains: the owned_ parameters this stage owns, then replicas of tied
  // weights; model_indices_[j] is params_[j]'s index in model_->parameters().
  std::vector<torch::Tensor> params_;
  int64_t owned_ = 0;
  std::vector<int64_t> model_indices_;
  std::vector<std::vector<torch::Tensor>> owned_by_stage_;  // K lists: what each stage broadcasts
  std::unique_ptr<TiedGradients> tied_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, torch::Tensor>> sends_;  // in flight
  double last_loss_ = 0.0;
  bool stale_ = false;  // other stages' weights on this rank are out of date
  int64_t peak_live_ = 0;
  int64_t held_bytes_ = 0, peak_held_bytes_ = 0;  // activations counted by a TensorMemoryCounter
  double receive_wait_s_ = 0.0;
};

}  // namespace lockstep::parallel
