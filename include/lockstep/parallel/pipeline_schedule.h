#pragma once

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::parallel {

// Note [Pipeline schedules]
// A pipeline stage runs the forward (F) and backward (B) of each of a step's M micro-batches in an
// order fixed by the schedule; neighbouring stages pair their sends and receives by that order.
// - GPipe: F0 .. F(M-1), then B(M-1) .. B0. Every stage holds all M micro-batches' activations
//   before its first backward.
// - 1F1B (PipeDream-Flush, as in Megatron-LM and PiPPy): stage s of K runs min(K-s-1, M) warm-up
//   forwards, then alternates one forward and one backward, then drains the remaining backwards;
//   backwards run in micro-batch order. Stage s holds at most K-s micro-batches' activations.
// Both flush at the end of the step (every backward done before the optimizer steps), so both
// compute the gradient of the whole mini-batch, and both leave the same bubble: each stage idles
// (K-1) micro-batch slots of M+K-1, the fraction (K-1)/(M+K-1) of the step (GPipe, section 2.3).

enum class PipelineSchedule { kGPipe, k1F1B };
const std::vector<std::string>& pipeline_schedule_names();  // "gpipe", "1f1b"

// How stages are cut when no split is given: blocks balanced by parameter count, or by their
// measured forward and backward time (torchgpipe's balance_by_size and balance_by_time; see
// Note [Balancing stages by time]).
enum class PipelineBalance { kParams, kTime };
const std::vector<std::string>& pipeline_balance_names();  // "params", "time"

struct PipelineOptions {
  TORCH_ARG(int64_t, stages) = 0;         // K, one per rank of a replica; 0: split's length, or the world size
  // M: each of the training loop's micro-batches is split into M pipeline micro-batches along the
  // batch dimension, as torch.distributed.pipeline.sync.Pipe's `chunks` (fewer when it has fewer
  // than M samples).
  TORCH_ARG(int64_t, micro_batches) = 1;
  TORCH_ARG(PipelineSchedule, schedule) = PipelineSchedule::kGPipe;
  // Blocks per stage, K numbers that sum to the model's block count; empty: balanced as `balance`
  // says (balanced_split).
  TORCH_ARG(std::vector<int64_t>, split);
  TORCH_ARG(PipelineBalance, balance) = PipelineBalance::kParams;
  // kTime: one pipeline micro-batch of inputs, as the model takes them, to time the blocks on.
  TORCH_ARG(torch::Tensor, balance_input);
};

struct PipelineAction {
  enum Kind { kForward, kBackward };
  Kind kind;
  int64_t micro_batch;
  bool operator==(const PipelineAction& o) const { return kind == o.kind && micro_batch == o.micro_batch; }
};

// The order of stage `stage`'s (of `stages`) forwards and backwards over `micro_batches`
// micro-batches (see Note [Pipeline schedules]).
std::vector<PipelineAction> pipeline_schedule(PipelineSchedule schedule, int64_t stage, int64_t stages,
                                              int64_t micro_batches);

// The textbook bubble fraction of a flushed pipeline: (K - 1) / (M + K - 1).
double bubble_fraction(int64_t stages, int64_t micro_batches);

// Blocks per stage for `stages` contiguous stages over blocks of `sizes` (e.g. parameter counts),
// each stage at least one block, minimising the largest stage's total. Throws naming the counts
// when there are more stages than blocks.
std::vector<int64_t> balanced_split(const std::vector<int64_t>& sizes, int64_t stages);

}  // namespace lockstep::parallel
