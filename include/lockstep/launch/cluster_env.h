#pragma once

#include <functional>

#include "lockstep/launch/launch_settings.h"

namespace lockstep::launch {

// The value of an environment variable, or nullptr when it is unset (std::getenv's contract); tests
// pass fixtures instead of the process's environment.
using EnvLookup = std::function<const char*(const char*)>;

// Note [Kubeflow PyTorchJob variables]
// The training operator (kubeflow/training-operator, pkg/controller.v1/pytorch) writes into every
// pod of a PyTorchJob with a Master replica: MASTER_ADDR / PET_MASTER_ADDR (the master pod's name),
// MASTER_PORT / PET_MASTER_PORT (its "pytorchjob-port", 23456 by default), RANK and PET_NODE_RANK
// (the pod's index: master 0, worker i is i + 1), PET_NNODES (pods), PET_NPROC_PER_NODE
// (spec.nprocPerNode, "auto" when unset) and WORLD_SIZE = pods x nprocPerNode (pods when it is not
// a number). Operators before 1.7 wrote only MASTER_ADDR, MASTER_PORT, WORLD_SIZE (pods) and RANK.
// An elastic job (spec.elasticPolicy) gets PET_RDZV_ENDPOINT (HOST:PORT, "<job>-worker-0" by
// default), PET_RDZV_BACKEND (c10d), PET_NNODES "MIN:MAX" or "N", and when set PET_MAX_RESTARTS,
// PET_NPROC_PER_NODE, PET_RDZV_ID, PET_RDZV_CONF ("key=value,...") and PET_STANDALONE.
//
// torchrun reads each of its --flags from PET_<FLAG> when the flag is not given; `lockstep run`
// does the same for the flags it shares with torchrun. The pod-level RANK and WORLD_SIZE count
// pods, not processes: `lockstep run` is the pod's entry point and gives each worker its own RANK
// and WORLD_SIZE. PET_NNODES "MIN:MAX" with MIN < MAX makes an elastic job (Note [Elastic
// rendezvous without a single point of failure]) that meets at PET_RDZV_ENDPOINT's host and
// numbers the nodes itself; a fixed-size job needs each node's rank, which a job without a Master
// replica does not write: PET_NODE_RANK must then come from the pod's replica-index label
// (docs/clusters.md).

// What the environment says about this node's place in a job: the PET_* variables torchrun reads
// (written by a PyTorchJob or by hand), else a pre-1.7 PyTorchJob's MASTER_ADDR + RANK +
// WORLD_SIZE. Empty when neither is there; a lone MASTER_ADDR, or the RANK/LOCAL_RANK of a
// launcher's worker, is not a job description. Throws c10::ValueError naming the variable, its
// value and the fix when a value is malformed or asks for what lockstep does not do.
LaunchSettings launch_settings_from_env(const EnvLookup& env);

}  // namespace lockstep::launch
