#include "lockstep/parallel/strategy.h"

#include <cmath>

#include "lockstep/core/names.h"
#include "lockstep/parallel/ddp_strategy.h"
#include "lockstep/parallel/dp_strategy.h"
#include "lockstep/parallel/fsdp_strategy.h"
#include "lockstep/parallel/local_strategy.h"
#include "lockstep/parallel/pipeline_strategy.h"
#include "lockstep/parallel/zero_strategy.h"

namespace lockstep::parallel {

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names{"local", "ddp", "dp", "zero1", "zero2", "fsdp", "pipeline"};
  return names;
}

StrategyKind parse_strategy(const std::string& name) {
  return enum_from_name<StrategyKind>(strategy_names(), name, "strategy");
}

std::string to_string(StrategyKind kind) { return enum_name(strategy_names(), kind); }

void check_strategy_options(const StrategyOptions& options) {
  TORCH_CHECK_VALUE(static_cast<bool>(options.optimizer()),
                    "StrategyOptions().optimizer(...) is unset: pass a factory that builds the optimizer");
  TORCH_CHECK_VALUE(std::isfinite(options.clip_value()) && options.clip_value() >= 0, "clip_value ",
                    options.clip_value(), " must be >= 0 (0: no clipping)");
  TORCH_CHECK_VALUE(std::isfinite(options.clip_norm()) && options.clip_norm() >= 0, "clip_norm ",
                    options.clip_norm(), " must be >= 0 (0: no clipping)");
}

void Strategy::load_sharded_state_dict(const ShardedState& state, const std::string& source) {
  TORCH_CHECK_VALUE(false, "rank ", state.rank, ": ", source, " holds the shards of a sharded strategy, which the ",
                    name(), " strategy does not hold; its full form is reassembled from every rank's file instead ",
                    "(train::Checkpointer does this when the strategy or the world size differs)");
}

int64_t tensor_bytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

bool has_sharded_state(StrategyKind kind) {
  return kind == StrategyKind::kFsdp || kind == StrategyKind::kZero1 || kind == StrategyKind::kZero2;
}

std::unique_ptr<Strategy> make_strategy(StrategyKind kind, torch::nn::AnyModule model, StrategyOptions options) {
  const int64_t world = options.group() ? options.group()->size() : 1;
  switch (kind) {
    case StrategyKind::kLocal:
      TORCH_CHECK_VALUE(world == 1, "the local strategy trains one process, but the group has ", world,
                        " ranks: use ddp, or run without a launcher");
      return std::make_unique<LocalStrategy>(std::move(model), std::move(options));
    case StrategyKind::kDdp:
      return std::make_unique<DdpStrategy>(std::move(model), std::move(options));
    case StrategyKind::kDp:
      TORCH_CHECK_VALUE(world == 1, "the dp strategy (DataParallel) is one process driving several replicas, but the "
                        "group has ", world, " ranks: use ddp under a launcher, or run dp without one");
      return std::make_unique<DpStrategy>(std::move(model), std::move(options));
    case StrategyKind::kZero1:
      return std::make_unique<ZeroStrategy>(std::move(model), std::move(options), ZeroOptions().stage(1));
    case StrategyKind::kZero2:
      return std::make_unique<ZeroStrategy>(std::move(model), std::move(options), ZeroOptions().stage(2));
    case StrategyKind::kFsdp:
      return std::make_unique<FsdpStrategy>(std::move(model), std::move(options));
    case StrategyKind::kPipeline:
      return std::make_unique<PipelineStrategy>(std::move(model), std::move(options));
  }
  TORCH_CHECK(false, "unhandled strategy ", static_cast<int>(kind));
}

}  // namespace lockstep::parallel
