#pragma once

#include "lockstep/train/options.h"
#include "lockstep/train/result.h"

namespace lockstep::train {

// `lockstep train`: options.model() on options.data(), through a Trainer (trainer.h) under the
// strategy options.strategy() names, evaluating on the test split after each epoch. Under a
// launcher (WORLD_SIZE > 1 in the environment: lockstep run, torchrun, mpirun, srun) it joins the
// process group first; only rank 0 shows progress and writes files.
TrainResult train(const TrainOptions& options);

}  // namespace lockstep::train
