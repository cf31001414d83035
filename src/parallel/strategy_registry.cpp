#include "lockstep/parallel/strategy_registry.h"

#include <functional>

#include "lockstep/core/names.h"
#include "lockstep/parallel/ddp_strategy.h"
#include "lockstep/parallel/dp_strategy.h"
#include "lockstep/parallel/fsdp_strategy.h"
#include "lockstep/parallel/local_strategy.h"
#include "lockstep/parallel/pipeline_strategy.h"
#include "lockstep/parallel/zero_strategy.h"

namespace lockstep::parallel {
namespace {

int64_t group_size(const StrategyOptions& options) { return options.group() ? options.group()->size() : 1; }

struct StrategyEntry {
  std::string name;
  bool sharded;  // has a sharded form (Strategy::sharded_state_dict)
  std::function<std::unique_ptr<Strategy>(torch::nn::AnyModule, StrategyOptions)> make;
};

// In StrategyKind's order.
const std::vector<StrategyEntry>& registry() {
  static const std::vector<StrategyEntry> entries{
      {"local", false,
       [](torch::nn::AnyModule model, StrategyOptions options) -> std::unique_ptr<Strategy> {
         TORCH_CHECK_VALUE(group_size(options) == 1, "the local strategy trains one process, but the group has ",
                           group_size(options), " ranks: use ddp, or run without a launcher");
         return std::make_unique<LocalStrategy>(std::move(model), std::move(options));
       }},
      {"ddp", false,
       [](torch::nn::AnyModule model, StrategyOptions options) -> std::unique_ptr<Strategy> {
         return std::make_unique<DdpStrategy>(std::move(model), std::move(options));
       }},
      {"dp", false,
       [](torch::nn::AnyModule model, StrategyOptions options) -> std::unique_ptr<Strategy> {
         TORCH_CHECK_VALUE(group_size(options) == 1, "the dp strategy (DataParallel) is one process driving several ",
                           "replicas, but the group has ", group_size(options), " ranks: use ddp under a launcher, ",
                           "or run dp without one");
         return std::make_unique<DpStrategy>(std::move(model), std::move(options));
       }},
      {"zero1", true,
       [](torch::nn::AnyModule model, StrategyOptions options) -> std::unique_ptr<Strategy> {
         return std::make_unique<ZeroStrategy>(std::move(model), std::move(options), ZeroOptions().stage(1));
       }},
      {"zero2", true,
       [](torch::nn::AnyModule model, StrategyOptions options) -> std::unique_ptr<Strategy> {
         return std::make_unique<ZeroStrategy>(std::move(model), std::move(options), ZeroOptions().stage(2));
       }},
      {"fsdp", true,
       [](torch::nn::AnyModule model, StrategyOptions options) -> std::unique_ptr<Strategy> {
         return std::make_unique<FsdpStrategy>(std::move(model), std::move(options));
       }},
      {"pipeline", false,
       [](torch::nn::AnyModule model, StrategyOptions options) -> std::unique_ptr<Strategy> {
         return std::make_unique<PipelineStrategy>(std::move(model), std::move(options));
       }},
  };
  return entries;
}

const StrategyEntry& registry_entry(StrategyKind kind) { return registry().at(static_cast<size_t>(kind)); }

}  // namespace

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const StrategyEntry& e : registry()) out.push_back(e.name);
    return out;
  }();
  return names;
}

StrategyKind parse_strategy(const std::string& name) {
  return enum_from_name<StrategyKind>(strategy_names(), name, "strategy");
}

std::string to_string(StrategyKind kind) { return enum_name(strategy_names(), kind); }

bool has_sharded_state(StrategyKind kind) { return registry_entry(kind).sharded; }

std::unique_ptr<Strategy> make_strategy(StrategyKind kind, torch::nn::AnyModule model, StrategyOptions options) {
  return registry_entry(kind).make(std::move(model), std::move(options));
}

}  // namespace lockstep::parallel
