#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "lockstep/dist/process_group.h"

namespace lockstep::parallel {

// Note [Agreeing on non-finite steps]
// A step whose loss or gradient is NaN or Inf on any rank is skipped on every rank, or the replicas
// would diverge. The losses are voted on by one small all-reduce (a flag per rank), started before
// the last backward so it travels while backward runs. Replicated gradients need no vote: after
// the gradient all-reduce every rank holds the same averaged gradients, and a non-finite gradient
// on any rank makes the average non-finite everywhere. The gradient check costs one host sync for
// all of them, not one per parameter.
class StepGuard {
 public:
  explicit StepGuard(dist::ProcessGroup* group);  // null: one process

  // Starts the vote on this rank's step loss and returns at once.
  void start_vote(double loss);

  // Waits for the vote. Returns "" when every rank's loss was finite and every tensor in
  // `gradients` is finite (pass none to skip the check: a GradScaler checks them itself);
  // otherwise why the step must be skipped, naming the ranks ("non-finite loss on rank 1").
  std::string verdict(const std::vector<torch::Tensor>& gradients);

 private:
  dist::ProcessGroup* group_;
  torch::Tensor vote_;  // (world) float: 1 where that rank's loss is non-finite
  c10::intrusive_ptr<c10d::Work> work_;
};

// Whether every element of every defined tensor is finite. See Note [Checking gradients for inf
// and NaN].
bool all_finite(const std::vector<torch::Tensor>& tensors);

}  // namespace lockstep::parallel
