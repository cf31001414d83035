#pragma once

#include "lockstep/train/options.h"
#include "lockstep/train/result.h"

namespace lockstep::train {

// Trains options.model() on options.data(), evaluating on the test split after each epoch, through
// the strategy options.strategy() names (see Note [The Strategy seam]). Under a launcher
// (WORLD_SIZE > 1 in the environment: lockstep run, torchrun, mpirun, srun) it joins the process
// group and each rank trains on its DistributedSampler share; losses and accuracy are averaged over
// ranks, and only rank 0 shows progress and writes files.
TrainResult train(const TrainOptions& options);

}  // namespace lockstep::train
