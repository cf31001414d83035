#pragma once
// The built-in strategies by name: one table (src/parallel/strategy_registry.cpp) that the CLI,
// its help, its errors and the training loop read. A new strategy is its header/source pair, a
// value here and one line in the table.

#include <torch/nn/modules/container/any.h>

#include <memory>
#include <string>
#include <vector>

#include "lockstep/parallel/strategy.h"

namespace lockstep::parallel {

// In strategy_names()'s order.
enum class StrategyKind { kLocal, kDdp, kDp, kZero1, kZero2, kFsdp, kPipeline };
// "local", "ddp", "dp", "zero1", "zero2", "fsdp", "pipeline"
const std::vector<std::string>& strategy_names();
StrategyKind parse_strategy(const std::string& name);  // error lists strategy_names()
std::string to_string(StrategyKind kind);

// Whether the built-in strategy `kind` has a sharded form (Strategy::sharded_state_dict): fsdp,
// zero1 and zero2.
bool has_sharded_state(StrategyKind kind);

// A built-in strategy over `model`. ddp, zero1, zero2 and fsdp need options.group(); local and dp
// refuse a group of several ranks.
std::unique_ptr<Strategy> make_strategy(StrategyKind kind, torch::nn::AnyModule model, StrategyOptions options);

}  // namespace lockstep::parallel
