#pragma once

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>

#include "lockstep/optim/optimizer.h"

namespace lockstep::optim {

// The optimizer's state in the layout of Python's optimizer.state_dict() (Note [Optimizer state
// layout] in state_dict.cpp):
//   {"state": {index: {name: tensor}}, "param_groups": [{hyperparameters..., "params": [index...]}]}
// with parameters numbered 0, 1, ... in order across groups. State tensors are CPU copies.
// Python's load_state_dict accepts it, and torch::pickle_save writes it so that torch.load reads
// it. Throws for an optimizer that is not a torch::optim::SGD, Adam or AdamW.
c10::IValue optimizer_state_dict(const torch::optim::Optimizer& optimizer);

// Replaces the optimizer's hyperparameters and state with `state`'s, as Python's
// optimizer.load_state_dict: written by optimizer_state_dict, by Python's state_dict() of the same
// kind, or (sgd) by lockstep before this module existed. Everything is checked before anything is
// changed; errors name `source`, the group or parameter index, and the shapes or values that
// disagree. State tensors take the parameter's dtype and device.
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::IValue& state,
                               const std::string& source);

// Bytes held by the optimizer's state tensors (SGD's momentum buffers; Adam's and AdamW's exp_avg,
// exp_avg_sq and max_exp_avg_sq): the optimizer's share of training memory. 0 before the first step.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace lockstep::optim
