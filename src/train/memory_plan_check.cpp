// The check lockstep train makes at launch: a plan that does not fit is refused with what does;
// and a model whose parameters alone cannot fit, refused before it is built.
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstdio>

#include "lockstep/train/memory_plan.h"
#include "memory_plan_layout.h"
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

// Note [Refusing fast]
// The check at launch must say no quickly (issue 34: under 2 s), and most of its time is the
// process's own start (loading LibTorch: 0.4-1.4 s here, by load) and dry runs. So:
// - A run whose model states alone do not fit is refused before any dry run: the process as it is
//   (code, data; the heap's free pages returned) plus each rank's parameters, gradients, optimizer
//   state and communication buffers in the strategy's layout is a lower bound on the plan's peak,
//   since every other term adds. The alternatives are named with their lower bounds too.
// - A refusal's alternatives differ from the run in their strategy (and checkpointing), and the
//   dry run depends only on the model, its precision, checkpointing and the data a replica reads:
//   they reuse the run's dry run (ProcessMemory::probes). Two ranks' five alternative strategies
//   and checkpointing made up to ten dry runs; they now make at most four (with and without
//   checkpointing, for data parallel and for the pipeline's replicas).
// - The check's small steps run on one intra-op thread (SingleThreadGuard): with two, the idle
//   OpenMP thread spins in libgomp (45% of a refused run's CPU samples under perf) against a loaded
//   host; mlp-wide's check took 3.0-3.2 s with two and 1.3 s with one at load 6. One thread lowers
//   the planned peak by about 1 MiB (0.4%): the second thread's stack and buffers.
// - train() checks before it makes its process group, so a refused rank does not first wait for
//   its peers to meet and connect: two ranks under `lockstep run` were refused in 2.1 and 1.65 s
//   (mlp-wide ddp, convnet zero2) instead of 3.1 and 1.7-2.9 s. Neither the check nor `lockstep
//   plan` has the group's own memory to measure (7.4 MiB per rank on two ranks, the difference of
//   the two orders' refusals): its shared-memory segment (6 MiB) is planned from its layout (Note
//   [Planning memory]), Gloo's pairs are not.
// The lower bound is for fp32 and O1 only: O2 and O3 convert the weights, which it does not model.
std::string early_refusal(const TrainOptions& o, const MemoryPlanOptions& p, const ReferenceData& data,
                          ProcessMemory& process, const MemoryLimit& limit) {
  const amp::OptLevel level = o.resolved_opt_level();
  if (level != amp::OptLevel::kO0 && level != amp::OptLevel::kO1) return "";
  const MemoryPlan states = plan_model_states(o, p, data, process);
  const RankMemory& worst = states.largest();
  if (worst.peak() <= limit.bytes) {
    process.layout.reset();  // not held through the dry run, whose peak it would raise
    return "";
  }
  std::vector<std::string> smaller;
  TrainOptions a = o;
  for (parallel::StrategyKind kind : alternative_strategies(o, p.world_size(), false)) {
    a.trainer().strategy(kind);
    try {
      const MemoryPlan alternative = plan_model_states(a, p, data, process);
      if (alternative.largest().peak() < worst.peak())
        smaller.push_back(c10::str(alternative.strategy, " at least ", format_mib(alternative.largest().peak()), " MiB"));
    } catch (const c10::ValueError&) {
      // a strategy this model cannot take: not an option
    }
  }
  return c10::str("rank ", worst.rank, " of ", states.world_size, " would need at least ", format_mib(worst.peak()),
                  " MiB under ", states.strategy, " at ", states.opt_level, ", more than the ", format_mib(limit.bytes),
                  " MiB it may use (", limit.source, "), before any activation: the process holds ",
                  format_mib(worst.baseline), " MiB with its data, and the model states and buffers add ",
                  format_mib(worst.peak() - worst.baseline), " MiB. Planned: ", rank_breakdown(worst), ". ",
                  smaller.empty() ? std::string("No other strategy holds fewer model states per rank")
                                  : "Per rank, before activations: " + c10::Join("; ", smaller),
                  ". Set TrainOptions::ignore_memory_plan to train anyway.");
}

// A count of parameters in full ("256000789504"), or in powers of ten past 2^53, where a double
// no longer holds every integer ("2.15e+24").
std::string count_text(double n) {
  char text[48];
  std::snprintf(text, sizeof(text), n < 9007199254740992.0 ? "%.0f" : "%.3g", n);
  return text;
}

// MiB with one decimal, from a double: the bytes of an absurd shape need not fit an int64.
std::string mib_text(double bytes) {
  char text[48];
  std::snprintf(text, sizeof(text), bytes < 1e15 ? "%.1f" : "%.3g", bytes / (1024.0 * 1024.0));
  return text;
}

// gpt-mini's tensors but the token embedding (models/gpt_mini.h), as doubles.
struct GptMiniCount {
  double positions = 0.0;  // wpe: context x d_model
  double blocks = 0.0;     // layers x (12 C^2 + 13 C)
  double final_norm = 0.0;
  double total() const { return positions + blocks + final_norm; }
};

GptMiniCount gpt_mini_count(const TrainOptions& o) {
  const auto c = static_cast<double>(o.n_embd());
  GptMiniCount n;
  n.positions = static_cast<double>(o.max_length()) * c;
  // c_attn 3C x C + 3C, attention's c_proj C x C + C, c_fc 4C x C + 4C, the MLP's c_proj C x 4C + C,
  // ln_1 and ln_2 2C each.
  n.blocks = static_cast<double>(o.n_layer()) * (12.0 * c * c + 13.0 * c);
  n.final_norm = 2.0 * c;
  return n;
}

// See Note [Refusing absurd shapes]: what each rank holds at least of the model's states under
// `kind` on `world` ranks, in fp32 bytes, for `parameters` trained parameters.
struct StatesBound {
  double parameters = 0.0;
  double gradients = 0.0;
  double optimizer_state = 0.0;
  double total() const { return parameters + gradients + optimizer_state; }
};

StatesBound states_bound(parallel::StrategyKind kind, amp::OptLevel level, double state_per_element,
                         double parameters, int64_t world) {
  using parallel::StrategyKind;
  StatesBound b;
  b.parameters = 4.0 * parameters;  // every rank builds the whole model in fp32 first
  // O2 and O3 convert the weights after the build, which the bound does not model; fsdp and the
  // pipeline keep a share of the parameters once built, so the build is their bound.
  if (level != amp::OptLevel::kO0 && level != amp::OptLevel::kO1) return b;
  if (kind == StrategyKind::kFsdp || kind == StrategyKind::kPipeline) return b;
  const double shards = static_cast<double>(world);
  b.gradients = kind == StrategyKind::kZero2 ? b.parameters / shards : b.parameters;
  const bool sharded_state = kind == StrategyKind::kZero1 || kind == StrategyKind::kZero2;
  b.optimizer_state = state_per_element * parameters / (sharded_state ? shards : 1.0);
  return b;
}

std::string states_text(const StatesBound& b) {
  return c10::str("parameters ", mib_text(b.parameters), ", gradients ", mib_text(b.gradients), ", optimizer state ",
                  mib_text(b.optimizer_state), " MiB");
}

}  // namespace

// See Note [Refusing absurd shapes].
double model_parameter_lower_bound(const TrainOptions& o) {
  if (!o.text() || !o.model_file().empty()) return 0.0;
  return gpt_mini_count(o).total();
}

void check_model_size(const TrainOptions& o, const MemoryPlanOptions& p, const MemoryLimit& limit) {
  const double parameters = model_parameter_lower_bound(o);
  if (parameters == 0.0) return;
  const double bytes = 4.0 * parameters;  // fp32, as every rank builds the model
  const GptMiniCount n = gpt_mini_count(o);
  const std::string model = c10::str(o.model(), " with TrainOptions::n_layer ", o.n_layer(), ", TrainOptions::n_embd ",
                                     o.n_embd(), " and TrainOptions::max_length ", o.max_length(), " has at least ",
                                     count_text(parameters), " parameters before its token embedding (the position ",
                                     "table, max_length x n_embd: ", count_text(n.positions), "; the ", o.n_layer(),
                                     " blocks: ", count_text(n.blocks), ")");
  const std::string lower = "Lower TrainOptions::max_length (the context; longer entries are truncated to it), "
                            "TrainOptions::n_embd or TrainOptions::n_layer";
  TORCH_CHECK_VALUE(bytes <= static_cast<double>(limit.bytes), model, ", ", mib_text(bytes), " MiB in fp32, which ",
                    "every rank builds whole before a strategy shards it: more than the ", format_mib(limit.bytes),
                    " MiB each rank may use (", limit.source, "). ", lower);
  // The optimizer's state per element, from the run's own optimizer stepped over stand-ins.
  const auto make = o.strategy_options(nullptr).optimizer();
  const double per_element = static_cast<double>(optimizer_bytes(make, {{2}}) - optimizer_bytes(make, {{1}}));
  const parallel::StrategyKind kind = o.resolved_strategy(p.world_size());
  const amp::OptLevel level = o.resolved_opt_level();
  const StatesBound states = states_bound(kind, level, per_element, parameters, p.world_size());
  if (states.total() <= static_cast<double>(limit.bytes)) return;
  std::vector<std::string> others;  // the strategies the run could take instead that hold less, as early_refusal's
  for (parallel::StrategyKind k : alternative_strategies(o, p.world_size(), false)) {
    const double bound = states_bound(k, level, per_element, parameters, p.world_size()).total();
    if (bound < states.total())
      others.push_back(c10::str(parallel::to_string(k), " at least ", mib_text(bound), " MiB"));
  }
  std::string instead = "On one rank every state is whole: more ranks under zero2 or fsdp share them";
  if (!others.empty())
    instead = c10::str("Per rank on ", p.world_size(), " ranks: ", c10::Join("; ", others));
  else if (p.world_size() > 1)
    instead = "No other strategy holds fewer model states per rank";
  TORCH_CHECK_VALUE(false, model, ": under ", parallel::to_string(kind), " at ", amp::to_string(level), " on ",
                    p.world_size(), p.world_size() == 1 ? " rank" : " ranks", " each rank holds at least ",
                    mib_text(states.total()), " MiB of model states before any activation (", states_text(states),
                    "), more than the ", format_mib(limit.bytes), " MiB it may use (", limit.source, "). ", instead,
                    ". ", lower);
}

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
  // See Note [Refusing fast].
  std::string early;
  try {
    early = early_refusal(o, p, data, process, limit);
  } catch (const std::exception&) {
    return;  // see the declaration: the run's own setup reports it
  }
  TORCH_CHECK(early.empty(), early);
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
