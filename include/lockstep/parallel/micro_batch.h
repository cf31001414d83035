#pragma once

#include <torch/types.h>

#include <functional>

#include "lockstep/amp/opt_level.h"
#include "lockstep/core/step_profiler.h"
#include "lockstep/parallel/step_guard.h"
#include "lockstep/parallel/strategy.h"

namespace lockstep::parallel {

// One micro-batch as the replica and sharded strategies run it: `forward` (input -> output, fp32
// in) and the loss under the opt level's autocast, timed as the forward and loss phases, then the
// scaled backward, timed as the backward phase. On the step's `last` micro-batch the non-finite
// vote on the step's loss (`loss_before` plus this one's) starts before the backward, so it
// travels while backward runs. Returns this micro-batch's weighted loss.
double run_micro_batch(const MicroBatch& micro_batch, const LossFunction& loss,
                       const std::function<torch::Tensor(const torch::Tensor&)>& forward, amp::Amp& amp,
                       StepProfiler& profiler, StepGuard& guard, double loss_before, bool last);

}  // namespace lockstep::parallel
