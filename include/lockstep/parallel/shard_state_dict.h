#pragma once

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

#include "lockstep/amp/grad_scaler.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/parallel/flat_parameters.h"

namespace lockstep::parallel {

// Note [Consolidated optimizer state]
// A ZeRO rank's optimizer steps one tensor, its shard of the flat parameters (Note [Flat
// parameters and shards]), so its own state_dict() holds one entry of flat (S) moments. Saved
// state must not depend on the strategy or the world size, so checkpoints hold what a replica's
// optimizer would: PyTorch's per-parameter layout (optim::optimizer_state_dict), one numbered
// entry per model parameter, shaped like it, as ZeroRedundancyOptimizer.consolidate_state_dict
// gives. Consolidating all-gathers each flat state tensor (exp_avg, exp_avg_sq, momentum_buffer,
// ...) and cuts it at the parameter offsets; per-element scalars (Adam's step) are the same on
// every rank and are copied to each parameter. Loading does the reverse from a per-parameter
// state written under any strategy and world size: each rank flattens it and keeps its range, so
// a zero2 checkpoint resumes under ddp and a ddp checkpoint under zero1, on any number of ranks.
// FSDP's optimizer steps one shard per unit (Note [FSDP units]): `flats` holds one layout per
// tensor the shard optimizer steps, in its order; ZeRO passes its one layout. Each flat parameter
// carries its model index, and the numbering runs over all the model's parameters: a frozen one
// (Note [Frozen parameters]) keeps its number in param_groups[0]["params"] and has no entry in
// "state", as with torch.optim.SGD(model.parameters()) in Python.

// Collective (every rank of `group` calls it, in the same order as other collectives): the shard
// optimizer's state in the per-parameter layout, the same on every rank.
c10::IValue consolidated_optimizer_state_dict(const torch::optim::Optimizer& shard_optimizer,
                                              const std::vector<const FlatParameters*>& flats,
                                              dist::ProcessGroup& group);

// Loads a per-parameter optimizer state (a replica's, or consolidated_optimizer_state_dict's) into
// the shard optimizer: this rank's range of each state tensor. Local (no collective). Errors name
// `source`, the parameter and the shapes; a state that some parameters have and others lack (a
// replica that left parameters unused) is refused, as a flat shard cannot hold it.
void load_sharded_optimizer_state_dict(torch::optim::Optimizer& shard_optimizer,
                                       const std::vector<const FlatParameters*>& flats, const c10::IValue& state,
                                       const std::string& source);

// A sharded strategy's Strategy::training_state_dict(): {"optimizer": the consolidated state,
// "scaler": the GradScaler's state}. Collective, as consolidated_optimizer_state_dict.
c10::impl::GenericDict sharded_training_state_dict(const torch::optim::Optimizer& shard_optimizer,
                                                   const std::vector<const FlatParameters*>& flats,
                                                   dist::ProcessGroup& group, const amp::GradScaler& scaler);
// Its Strategy::load_training_state_dict(): the optimizer's shards, and the scaler's state when it
// scales. Local.
void load_sharded_training_state_dict(torch::optim::Optimizer& shard_optimizer,
                                      const std::vector<const FlatParameters*>& flats, amp::GradScaler& scaler,
                                      const c10::impl::GenericDict& state, const std::string& source);

}  // namespace lockstep::parallel
