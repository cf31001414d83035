// The check lockstep train makes at launch: a plan that does not fit is refused with what does.
#include <c10/util/StringUtil.h>

#include <algorithm>

#include "lockstep/train/memory_plan.h"
#include "memory_probe.h"

namespace lockstep::train {
namespace {

// The strategies a refused run could take instead: on one rank, only local (with activation
// checkpointing); on several, those that train at its opt level (zero1, zero2 and fsdp at O0 and
// O1; the pipeline at O0, with at least as many blocks as ranks), and its own with checkpointing.
std::vector<parallel::StrategyKind> alternative_strategies(const TrainOptions& o, int64_t world, bool checkpointing) {
  using parallel::StrategyKind;
  const StrategyKind current = o.resolved_strategy(world);
  if (world == 1) return checkpointing ? std::vector<StrategyKind>{current} : std::vector<StrategyKind>{};
  const amp::OptLevel level = o.resolved_opt_level();
  std::vector<StrategyKind> kinds;
  for (StrategyKind kind : {StrategyKind::kDdp, StrategyKind::kZero1, StrategyKind::kZero2, StrategyKind::kFsdp,
                            StrategyKind::kPipeline}) {
    const bool sharded = kind == StrategyKind::kZero1 || kind == StrategyKind::kZero2 || kind == StrategyKind::kFsdp;
    if (sharded && level != amp::OptLevel::kO0 && level != amp::OptLevel::kO1) continue;
    if (kind == StrategyKind::kPipeline && level != amp::OptLevel::kO0) continue;
    if (kind == current && !checkpointing) continue;
    kinds.push_back(kind);
  }
  return kinds;
}

}  // namespace

std::string memory_plan_refusal(const MemoryPlan& plan, const MemoryLimit& limit,
                                const std::vector<MemoryPlan>& alternatives) {
  const RankMemory& worst = plan.largest();
  if (worst.peak() <= limit.bytes) return "";
  std::string text = c10::str("rank ", worst.rank, " of ", plan.world_size, " would need ", format_mib(worst.peak()),
                              " MiB at its peak (", worst.peak_moment(), ") under ", plan.strategy, " at ",
                              plan.opt_level, ", batch ", plan.batch_size, ", more than the ", format_mib(limit.bytes),
                              " MiB it may use (", limit.source, "). Planned: ", rank_breakdown(worst), ". ");
  std::vector<const MemoryPlan*> fitting;
  for (const MemoryPlan& a : alternatives)
    if (a.largest().peak() <= limit.bytes) fitting.push_back(&a);
  std::sort(fitting.begin(), fitting.end(),
            [](const MemoryPlan* a, const MemoryPlan* b) { return a->largest().peak() < b->largest().peak(); });
  std::vector<std::string> fits;
  for (const MemoryPlan* a : fitting) {
    const bool ckpt = a->checkpoint_activations && !plan.checkpoint_activations;
    fits.push_back(c10::str(a->strategy, ckpt ? " with activation checkpointing (TrainerOptions::checkpoint_activations)" : "",
                            " needs ", format_mib(a->largest().peak()), " MiB per rank", ckpt && a->strategy == plan.strategy
                                ? c10::str(" (saves ", format_mib(worst.peak() - a->largest().peak()), " MiB)") : ""));
  }
  text += fits.empty() ? "No other strategy or activation checkpointing fits either: lower the batch size, or give "
                         "the run more memory"
                       : "What fits, cheapest first: " + c10::Join("; ", fits);
  return text + ". Set TrainOptions::ignore_memory_plan to train anyway.";
}

void check_memory_plan(const TrainOptions& o, const MemoryPlanOptions& p, const ReferenceData& data,
                       ProcessMemory process, const MemoryLimit& limit) {
  MemoryPlan plan;
  try {
    plan = plan_with_data(o, p, data, process);
  } catch (const std::exception&) {  // c10::Error, and TorchScript's interpreter errors
    return;  // see the declaration: the run's own setup reports it
  }
  if (plan.largest().peak() <= limit.bytes) return;
  std::vector<MemoryPlan> alternatives;
  for (bool checkpointing : {false, true}) {
    if (checkpointing && o.trainer().checkpoint_activations()) continue;
    TrainOptions a = o;
    if (checkpointing) a.trainer().checkpoint_activations(true);
    for (parallel::StrategyKind kind : alternative_strategies(o, p.world_size(), checkpointing)) {
      a.trainer().strategy(kind);
      try {
        alternatives.push_back(plan_with_data(a, p, data, process));
      } catch (const c10::ValueError&) {
        // a strategy this model cannot take (a pipeline of more stages than blocks): not an option
      }
    }
  }
  TORCH_CHECK(false, memory_plan_refusal(plan, limit, alternatives));
}

}  // namespace lockstep::train
