#include "lockstep/parallel/pipeline_schedule.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

namespace lockstep::parallel {

const std::vector<std::string>& pipeline_schedule_names() {
  static const std::vector<std::string> names{"gpipe", "1f1b"};
  return names;
}

const std::vector<std::string>& pipeline_balance_names() {
  static const std::vector<std::string> names{"params", "time"};
  return names;
}

std::vector<PipelineAction> pipeline_schedule(PipelineSchedule schedule, int64_t stage, int64_t stages,
                                              int64_t micro_batches) {
  TORCH_CHECK_VALUE(stages >= 1 && stage >= 0 && stage < stages, "stage ", stage, " is not one of ", stages, " stages");
  TORCH_CHECK_VALUE(micro_batches >= 1, "a pipeline step needs at least one micro-batch, got ", micro_batches);
  std::vector<PipelineAction> actions;
  const auto forward = [&](int64_t i) { actions.push_back({PipelineAction::kForward, i}); };
  const auto backward = [&](int64_t i) { actions.push_back({PipelineAction::kBackward, i}); };
  if (schedule == PipelineSchedule::kGPipe) {
    for (int64_t i = 0; i < micro_batches; ++i) forward(i);
    for (int64_t i = micro_batches - 1; i >= 0; --i) backward(i);
    return actions;
  }
  const int64_t warmup = std::min(stages - stage - 1, micro_batches);
  for (int64_t i = 0; i < warmup; ++i) forward(i);
  for (int64_t i = 0; i < micro_batches - warmup; ++i) {
    forward(warmup + i);
    backward(i);
  }
  for (int64_t i = micro_batches - warmup; i < micro_batches; ++i) backward(i);
  return actions;
}

double bubble_fraction(int64_t stages, int64_t micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

// Linear partition by dynamic programming: best[k][n] is the smallest possible largest stage over
// the first n blocks in k stages. Models have tens of blocks, so O(K n^2) is nothing.
std::vector<int64_t> balanced_split(const std::vector<int64_t>& sizes, int64_t stages) {
  const int64_t n = static_cast<int64_t>(sizes.size());
  TORCH_CHECK_VALUE(stages >= 1, "a pipeline needs at least one stage, got ", stages);
  TORCH_CHECK_VALUE(stages <= n, stages, " pipeline stages but the model has only ", n,
                    " blocks: every stage needs at least one; use at most ", n, " stages");
  std::vector<int64_t> prefix(n + 1, 0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + sizes[i];
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(stages + 1, std::vector<int64_t>(n + 1, kInf));
  std::vector<std::vector<int64_t>> cut(stages + 1, std::vector<int64_t>(n + 1, 0));
  best[0][0] = 0;
  for (int64_t k = 1; k <= stages; ++k)
    for (int64_t end = k; end <= n; ++end)
      for (int64_t start = k - 1; start < end; ++start) {
        if (best[k - 1][start] == kInf) continue;
        const int64_t worst = std::max(best[k - 1][start], prefix[end] - prefix[start]);
        if (worst < best[k][end]) best[k][end] = worst, cut[k][end] = start;
      }
  std::vector<int64_t> counts(stages);
  for (int64_t k = stages, end = n; k >= 1; --k) {
    counts[k - 1] = end - cut[k][end];
    end = cut[k][end];
  }
  return counts;
}

}  // namespace lockstep::parallel
