#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/dist/process_group.h"

namespace lockstep::parallel {

// Note [Pipeline optimizer state]
// Each pipeline stage's optimizer numbers its own parameters 0 .. n-1 (Note [Optimizer state
// layout]); a checkpoint numbers the whole model's, 0 .. N-1 in model order, as one optimizer over
// the whole model would (ddp, local), so a checkpoint resumes under any strategy. Stage s owns the
// run [first_s, first_s + o_s) of the model's parameters, its first o_s, so its number j < o_s is
// first_s + j; after them come replicas of weights tied to earlier stages (Note [Tied weights
// across stages]), which a checkpoint takes from their owners and a stage loads by their owners'
// numbers. Both functions assume one param group, as lockstep's optimizers have.

// Collective over `group` (null: one process): every rank gives its stage's optimizer state dict,
// the model index of its first owned parameter and how many it owns; rank 0 returns the whole
// model's state dict (the stages' owned parameters' states renumbered, the first stage's
// hyperparameters, params 0 .. total_params-1), the other ranks their own state unchanged. Ranks
// 1 .. stages-1 (the first replica's other stages) send their states to rank 0 pickled, by
// send/recv; further replicas hold the same states and send nothing.
c10::IValue gather_optimizer_state(const c10::IValue& stage_state, int64_t first_param, int64_t owned,
                                   int64_t total_params, int64_t stages, dist::ProcessGroup* group);

// The part of a whole model's optimizer state dict `state` for the model's parameters
// `model_indices` (the stage optimizer's j-th parameter is the model's model_indices[j]), numbered
// from 0. Throws naming `source` when the state has more than one param group or too few
// parameters.
c10::IValue slice_optimizer_state(const c10::IValue& state, const std::vector<int64_t>& model_indices,
                                  const std::string& source);

}  // namespace lockstep::parallel
