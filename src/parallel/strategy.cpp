#include "lockstep/parallel/strategy.h"

#include <cmath>

namespace lockstep::parallel {

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

}  // namespace lockstep::parallel
