#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <vector>

#include "lockstep/models/classifier.h"

namespace lockstep::parallel {

// Note [Activation checkpointing]
// torch.utils.checkpoint for LibTorch: a segment of the forward runs without keeping its
// activations (grad mode off, as an autograd Function's forward runs), and only its inputs are
// saved; backward runs the segment again with grad on and back-propagates through the recomputed
// graph. Memory holds the segments' inputs plus one segment's activations at a time, for about one
// extra forward of compute. Three things must make the recompute equal the forward:
// - Randomness: the CPU generator's state at the segment's start is saved, set again for the
//   recompute and put back afterwards (Python's preserve_rng_state), so dropout draws the same mask
//   and the rest of training sees the generator as if there had been no recompute.
// - Precision: the autocast state of the forward (on, and its dtype) is re-entered for the recompute.
// - Buffers: the forward already updated BatchNorm's running statistics once; the recompute would
//   update them a second time (Python's reentrant checkpoint does), so the segment's buffers are
//   copied before the recompute and restored after it. The recompute still normalises with the
//   batch statistics, as the forward did, so values and gradients are unchanged.
// Parameters are inputs of the Function, and their gradients are returned through the graph
// rather than accumulated inside backward, so torch::autograd::grad, DDP's gradient hooks and
// gradient accumulation see them as from any other op. Under NoGrad (evaluation) the segment simply
// runs. Outputs must be floating point; the segment must not change its inputs in place.

struct CheckpointOptions {
  // Restore the CPU generator for the recompute (off: dropout would draw new masks, as Python's
  // preserve_rng_state=False).
  TORCH_ARG(bool, preserve_rng_state) = true;
};

using SegmentFunction = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>& inputs)>;

// Runs `function` on `inputs` under activation checkpointing (see Note [Activation checkpointing]).
// `parameters`: the tensors it reads besides its inputs that need gradients (a module's
// parameters()); `buffers`: the tensors it updates in place that must be updated once (BatchNorm's
// running statistics). Returns its outputs, connected to the graph through one node. `function`
// is kept until backward and called again there: it must capture by value what it uses.
std::vector<torch::Tensor> checkpoint(const SegmentFunction& function, const std::vector<torch::Tensor>& inputs,
                                      const std::vector<torch::Tensor>& parameters = {},
                                      const std::vector<torch::Tensor>& buffers = {},
                                      const CheckpointOptions& options = {});

// The same for a module's forward of one tensor: its parameters and buffers are the segment's.
//   x = parallel::checkpoint(*block, [&](const torch::Tensor& t) { return block->forward(t); }, x);
torch::Tensor checkpoint(torch::nn::Module& module, const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                         const torch::Tensor& input, const CheckpointOptions& options = {});

// A models::BlockRunner that checkpoints every block of a reference model:
//   model->set_block_runner(parallel::checkpoint_block);  // lockstep train --checkpoint-activations
torch::Tensor checkpoint_block(const models::Block& block, const torch::Tensor& input);

}  // namespace lockstep::parallel
