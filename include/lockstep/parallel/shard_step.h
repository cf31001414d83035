#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "lockstep/amp/opt_level.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/parallel/step_guard.h"
#include "lockstep/parallel/strategy.h"

namespace lockstep::parallel {

// Note [Stepping shards]
// ZeRO and FSDP ranks each hold the gradient of their shards only, averaged over ranks, so the
// decisions a replica takes on its whole gradient need the other ranks: the non-finite check and
// clip_grad_norm_'s total norm come from one all-reduce of each rank's squared shard norm, in its
// slot (N fp64 values), and a non-finite slot names the rank whose shard holds it. Clipping by
// value is element-wise and needs nothing. With loss scaling the GradScaler checks the shards
// itself (its group spans the ranks). Then the shard optimizer steps.

// The group the sharded strategy `name` runs over, after checking that options.group() is set and
// the opt level is O0 or O1 (errors name the rank and the fix); `shards` says what it shards
// across ranks ("the optimizer state").
dist::ProcessGroup& sharding_group(const StrategyOptions& options, const std::string& name, const std::string& shards);

// Collective. Waits for the loss vote started on `guard`, then checks, clips and steps the
// optimizer over `grad_shards` (the .grad of every tensor the shard optimizer steps, (S_k) fp32
// each) as Note [Stepping shards] says, and updates the loss scale.
StepDecision step_shards(StepGuard& guard, amp::Amp& amp, dist::ProcessGroup& group, const StrategyOptions& options,
                         const std::vector<torch::Tensor>& grad_shards);

}  // namespace lockstep::parallel
