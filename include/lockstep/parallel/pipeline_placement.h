#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "lockstep/dist/process_group.h"
#include "lockstep/models/classifier.h"
#include "lockstep/parallel/pipeline_schedule.h"

namespace lockstep::parallel {

// Note [Tied weights across stages]
// A model may use one parameter in two blocks: gpt-mini's token embedding wte.weight is its input
// embedding (block "embed", the first) and, tied, its output layer (block "head", the last). A
// parameter belongs to the first block that lists it. The stage running that block owns it: it
// is in that stage's run of the model's parameters, its optimizer state is saved in the whole
// model's numbering from there, and that stage broadcasts it when the whole model is brought to
// every rank. A later stage whose blocks also list it holds a replica: the same tensor of that
// rank's whole-model copy, in its optimizer after its owned parameters. Megatron-LM keeps its word
// embeddings on the first and the last stage the same way:
// - After each step's last backward each stage holding the weight has the derivative of the loss
//   through its own use of it; the whole model's gradient is their sum. One all-reduce (a sum) in
//   a subgroup of those stages' ranks, one subgroup per set of stages and pipeline replica (made as
//   Note [Pipeline replicas]'s stage groups are: every rank makes every one, in the same order),
//   gives each the sum. It runs after the replicas' average over each stage's subgroup: the mean
//   over replicas of stage 0's part plus the mean of stage K-1's part is the mean over replicas of
//   the whole gradient, the global batch's, as one process computes it.
// - Both stages then clip by the same factor and step the same values with the same optimizer
//   state, so the copies, equal at construction (the strategy gives every rank rank 0's weights),
//   stay equal bit for bit with no broadcast of the weight.
// - Only the owner counts it: the gradient norm for clipping and the non-finite vote sum over owned
//   parameters, and a checkpoint gathers the owned parameters' optimizer state, so the replica
//   neither shifts nor repeats the whole model's numbering (one wte, as the unwrapped model's
//   state dict has it). Loading gives the replica its owner's state.
// - With K = 1, or with every block that lists the weight on one stage, it has no replica and
//   nothing extra runs.

// Where one of the model's parameters lives in a pipeline.
struct ParameterPlacement {
  torch::Tensor parameter;
  int64_t index = 0;            // its position in model.parameters()
  std::vector<int64_t> stages;  // the stages whose blocks list it, ascending; stages[0] owns it
};

// Every parameter of the model, in model order, placed on stages cut at `boundaries` (K + 1
// entries: stage s runs blocks [b[s], b[s+1])). Throws naming the block when the blocks' first
// listings do not follow the order of `parameters` (a block's new parameters must follow the
// modules' registration; one listed by an earlier block may come again), or leave one out.
std::vector<ParameterPlacement> place_parameters(const std::vector<models::Block>& blocks,
                                                 const std::vector<int64_t>& boundaries,
                                                 const std::vector<torch::Tensor>& parameters);

// What one stage trains, in its optimizer's order: owned, then tied.
struct StageParameters {
  std::vector<torch::Tensor> owned;   // a contiguous run of the model's parameters
  int64_t first_owned = 0;            // model index of owned[0]: how many earlier stages own
  std::vector<torch::Tensor> tied;    // replicas of parameters that earlier stages own
  std::vector<int64_t> tied_indices;  // their model indices

  std::vector<torch::Tensor> all() const;
  std::vector<int64_t> model_indices() const;  // of all(): the optimizer's j-th parameter is the model's [j]
};
StageParameters stage_parameters(const std::vector<ParameterPlacement>& placement, int64_t stage);

// Sums the gradients of the weights a pipeline replica's stages share (see Note [Tied weights
// across stages]).
class TiedGradients {
 public:
  // Collective over `group` (null: one process) when any parameter is on several stages: rank r is
  // stage r mod `stages` of replica r / `stages`.
  TiedGradients(const std::vector<ParameterPlacement>& placement, int64_t stages, dist::ProcessGroup* group);
  ~TiedGradients();

  // After the step's last backward: each shared weight's gradient becomes the sum of its stages'
  // (an unused copy's undefined gradient counts as zeros).
  void sum();
  // The shared weights on this rank.
  int64_t count() const;

 private:
  struct Tie {
    std::unique_ptr<dist::ProcessGroup> group;  // the ranks of one set of stages of this replica
    std::vector<torch::Tensor> parameters;
  };
  std::vector<Tie> ties_;
};

// Stage s of `stages` runs blocks [v[s], v[s+1]) of `blocks`: o.split()'s counts, or balanced by
// parameter count (balanced_split) when it is empty. The pipeline strategy's cut, and what a
// memory plan lays out (train/memory_plan.h). Throws c10::ValueError naming the counts when they
// do not cover the blocks, one or more per stage.
std::vector<int64_t> stage_boundaries(const std::vector<models::Block>& blocks, const PipelineOptions& o,
                                      int64_t stages);

}  // namespace lockstep::parallel
