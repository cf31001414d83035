#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "lockstep/core/report.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/models/classifier.h"

namespace lockstep::parallel {

// Note [Balancing stages by time]
// A split by parameter count balances memory, not time. ResNet-18 shows the difference: its last
// BasicBlocks hold most of the parameters but work on 4x4 maps, while the stem and the first
// layers hold few parameters and do most of the arithmetic, so cutting it by parameters gives the
// first stage most of the work and leaves the second waiting (65-72% idle in the pipeline sweep,
// where the bubble formula predicts 20% at M=4). `--balance time` cuts by cost instead, as
// torchgpipe's balance_by_time does: each block's forward and backward is timed on one pipeline
// micro-batch of real inputs (a warm-up pass, then the median of three), and balanced_split
// minimises the slowest stage's total. Rank 0 measures and broadcasts the split, so every rank
// cuts the same stages whatever its own timings say. Measuring leaves no trace in training:
// gradients come from autograd::grad (nothing is accumulated into .grad), the blocks' buffers
// (BatchNorm's running statistics) and the CPU generator's state are restored afterwards, so a
// run balanced by time trains exactly as the same split given by hand with --split.

// Each block's forward plus backward time in microseconds (at least 1) on `input` (one
// micro-batch as the first block takes it), the median of `repeats` passes after a warm-up.
std::vector<int64_t> block_times_us(const std::vector<models::Block>& blocks, const torch::Tensor& input,
                                    int64_t repeats = 3);

// Blocks per stage for `stages` stages balanced by block_times_us, measured on rank 0 of `group`
// (null: this process) and the same on every rank; rank 0 reports the split and each stage's time
// to `reporter`. Collective.
std::vector<int64_t> split_by_time(const std::vector<models::Block>& blocks, const torch::Tensor& input,
                                   int64_t stages, dist::ProcessGroup* group, const Reporter& reporter = {});

}  // namespace lockstep::parallel
