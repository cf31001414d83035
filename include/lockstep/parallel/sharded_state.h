#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/amp/grad_scaler.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/parallel/flat_parameters.h"

namespace lockstep::parallel {

// Note [Sharded state]
// PyTorch's FSDP has two ways to save: FULL_STATE_DICT gathers the whole model (and, through
// FSDP.optim_state_dict, the whole optimizer state) on rank 0, and SHARDED_STATE_DICT lets every
// rank save what it already holds, with torch.distributed.checkpoint writing one file per rank.
// lockstep's model_state_dict() and training_state_dict() are the first; this is the second.
// A rank of a sharded strategy (fsdp, zero1, zero2) holds, per flat buffer its optimizer steps
// (an FSDP unit, or ZeRO's one buffer; Note [Flat parameters and shards]):
//   - its parameter shard, (S) fp32, elements [r*S, (r+1)*S) of the padded flat buffer;
//   - the shard optimizer's own state_dict(), whose entry k holds shard k's flat (S) moments;
// plus its GradScaler state and its module buffers (BatchNorm statistics stay per rank under
// these strategies). Nothing is gathered: saving needs no collective at all, so no rank ever holds
// more than its shards while saving, which is the point of the form (a model too large to gather
// on one rank still checkpoints). A ShardLayout says where each parameter lies in a flat buffer,
// so the N ranks' states can be put back together without the model: the flat buffer is the N
// shards end to end, each parameter is its range at its offset, reshaped, and each flat moment is
// cut the same way into PyTorch's per-parameter optimizer layout (Note [Consolidated optimizer
// state]); per-element scalars (Adam's step) are the same on every rank. So a sharded checkpoint
// resumes shard by shard on the same strategy and world size (no rank reads another's file), and
// under any other strategy or world size through the full form's path. Frozen parameters (Note
// [Frozen parameters]) are in no shard: every rank saves them whole, as it saves its buffers, so
// its file alone restores them, and each layout lists its parameters' model indices, so the
// reassembled optimizer state numbers every parameter as a replica's does.

// Where the parameters of one flat buffer lie (see FlatParameters): the same on every rank.
struct ShardLayout {
  std::string name;                         // the FSDP unit ("fc1", "layer1.0+layer1.1"), or "model"
  std::vector<std::string> params;          // the parameters' state-dict names, in layout order
  std::vector<std::vector<int64_t>> shapes;  // their shapes
  std::vector<int64_t> offsets;             // their element offsets in the padded flat buffer
  std::vector<int64_t> indices;             // their positions in the model's parameters()
  int64_t shard_numel = 0;                  // S: elements per rank (the buffer holds N x S)

  bool operator==(const ShardLayout& other) const;
  bool operator!=(const ShardLayout& other) const { return !(*this == other); }
  // "fc1 (2 parameters, 100480 per rank)", for errors.
  std::string describe() const;
};

ShardLayout shard_layout(std::string name, const FlatParameters& flat);

// Layouts as a pickled list of dicts {"name", "params", "shapes", "offsets", "indices",
// "shard_numel"}, and back (errors name `source`). Files written before "indices" number the
// parameters of the list consecutively, as they were then.
c10::IValue layouts_to_ivalue(const std::vector<ShardLayout>& layouts);
std::vector<ShardLayout> layouts_from_ivalue(const c10::IValue& value, const std::string& source);

// What one rank of a sharded strategy holds (Note [Sharded state]).
struct ShardedState {
  int64_t rank = 0;
  int64_t world_size = 1;
  std::vector<ShardLayout> layouts;   // one per shard, in the shard optimizer's order
  std::vector<torch::Tensor> shards;  // (S_k) fp32: this rank's range of flat buffer k (copies)
  c10::IValue optimizer;              // the shard optimizer's own state_dict(): entry k is shard k's
  c10::IValue scaler;                 // GradScaler.state_dict(); {} without loss scaling
  c10::Dict<std::string, torch::Tensor> buffers;  // this rank's module buffers, by state-dict key
  c10::Dict<std::string, torch::Tensor> frozen;   // the frozen parameters, whole, by state-dict key
  std::vector<std::string> model_keys;            // the full state dict's keys, in order
};

// As a pickled dict {"rank", "world_size", "units": layouts, "shards": {unit: (S) tensor},
// "optimizer", "scaler", "buffers", "frozen", "model_keys"}, which Python's torch.load reads; and
// back (a file without "frozen" has none).
c10::impl::GenericDict sharded_state_to_dict(const ShardedState& state);
ShardedState sharded_state_from_dict(const c10::IValue& value, const std::string& source);

// A sharded strategy's Strategy::sharded_state_dict(): copies of `shards` (flat buffer k's range on
// this rank), the shard optimizer's and the scaler's state, `module`'s buffers and its parameters
// that no layout lists (the frozen ones). Local.
ShardedState make_sharded_state(const std::vector<ShardLayout>& layouts, const std::vector<torch::Tensor>& shards,
                                const torch::optim::Optimizer& shard_optimizer, const amp::GradScaler& scaler,
                                const torch::nn::Module& module, const dist::ProcessGroup& group);

// Its Strategy::load_sharded_state_dict(): checks that `state` is this rank's of a run with the same
// world size and `layouts` (errors name `source`, the unit and the fix), then copies its shards into
// `shards` and loads the optimizer, the scaler (when it scales), the buffers and the frozen
// parameters. Local.
void load_sharded_state(const ShardedState& state, const std::vector<ShardLayout>& layouts,
                        const std::vector<torch::Tensor>& shards, torch::optim::Optimizer& shard_optimizer,
                        amp::GradScaler& scaler, torch::nn::Module& module, const dist::ProcessGroup& group,
                        const std::string& source);

// The full form of N ranks' sharded states (entry r is rank r's): what model_state_dict() and
// training_state_dict() of the strategy that wrote them would have returned (rank 0's buffers and
// scaler). Local: reads nothing but its arguments. Errors name `source` and the rank.
struct ConsolidatedState {
  c10::Dict<std::string, torch::Tensor> model;  // the unwrapped model's keys, in order
  c10::IValue optimizer;                        // per-parameter (Note [Consolidated optimizer state])
  c10::IValue scaler;
};
ConsolidatedState consolidate_sharded_states(const std::vector<ShardedState>& ranks, const std::string& source);

}  // namespace lockstep::parallel
