#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>

#include "lockstep/dist/process_group.h"

namespace lockstep::parallel {

// Note [Pipeline optimizer state]
// Each pipeline stage's optimizer numbers its own parameters 0 .. n-1 (Note [Optimizer state
// layout]); a checkpoint numbers the whole model's, 0 .. N-1 in model order, as one optimizer over
// the whole model would (ddp, local), so a checkpoint resumes under any strategy. Stage s's
// parameters are the run [first_s, first_s + n_s) of the model's, so its number j is first_s + j.
// Both functions assume one param group, as lockstep's optimizers have.

// Collective over `group` (null: one process): every rank gives its stage's optimizer state dict
// and the model index of its first parameter; rank 0 returns the whole model's state dict (the
// stages' states renumbered, the first stage's hyperparameters, params 0 .. total_params-1), the
// other ranks their own state unchanged. Ranks 1 .. stages-1 (the first replica's other stages)
// send their states to rank 0 pickled, by send/recv; further replicas hold the same states and
// send nothing.
c10::IValue gather_optimizer_state(const c10::IValue& stage_state, int64_t first_param, int64_t total_params,
                                   int64_t stages, dist::ProcessGroup* group);

// The part of a whole model's optimizer state dict `state` for parameters [first_param,
// first_param + count), numbered from 0. Throws naming `source` when the state has more than one
// param group or fewer parameters than that.
c10::IValue slice_optimizer_state(const c10::IValue& state, int64_t first_param, int64_t count,
                                  const std::string& source);

}  // namespace lockstep::parallel
