#include "lockstep/parallel/fsdp_strategy.h"

#include <torch/torch.h>

#include <algorithm>
#include <unordered_map>

#include "lockstep/models/state_dict.h"
#include "lockstep/optim/state_dict.h"
#include "lockstep/parallel/distributed_data_parallel.h"
#include "lockstep/parallel/micro_batch.h"
#include "lockstep/parallel/shard_state_dict.h"
#include "lockstep/parallel/shard_step.h"

namespace lockstep::parallel {
namespace {

// Gradient buckets of a unit's reduce-scatter, as zero2's default.
constexpr int64_t kBucketCapBytes = 25 * 1024 * 1024;

int64_t numel(const std::vector<IndexedParameter>& params) {
  int64_t n = 0;
  for (const auto& p : params) n += p.tensor.numel();
  return n;
}

}  // namespace

// See Note [FSDP as a strategy] and the declaration's comment (fsdp_unit.h).
std::vector<UnitPlan> plan_units(torch::nn::Module& module, const std::vector<models::Block>& blocks,
                                 int64_t min_params, int64_t rank) {
  const auto named = module.named_parameters();
  std::unordered_map<const void*, size_t> index;  // TensorImpl -> position in named_parameters()
  for (size_t i = 0; i < named.size(); ++i) index.emplace(named[i].value().unsafeGetTensorImpl(), i);
  std::unordered_map<const void*, size_t> last_use;  // TensorImpl -> the last block that lists it
  for (size_t b = 0; b < blocks.size(); ++b)
    for (const torch::Tensor& p : models::block_parameters(blocks[b])) last_use[p.unsafeGetTensorImpl()] = b;
  std::vector<UnitPlan> plans;
  UnitPlan open;
  size_t open_until = 0;  // the open unit may not close before this block
  size_t next = 0;        // the model index the next parameter must have
  for (size_t b = 0; b < blocks.size(); ++b) {
    const models::Block& block = blocks[b];
    const std::vector<torch::Tensor> params = models::block_parameters(block);
    if (params.empty()) continue;
    for (const torch::Tensor& p : params) {
      auto it = index.find(p.unsafeGetTensorImpl());
      if (it != index.end() && it->second < next) continue;  // an earlier block's, in the open unit
      TORCH_CHECK_VALUE(it != index.end() && it->second == next, "rank ", rank, ": fsdp cannot shard this model by its ",
                        "blocks: block '", block.name, "' uses ",
                        it == index.end() ? std::string("a tensor that is not a parameter of the model")
                                          : "parameter '" + named[it->second].key() + "'",
                        " where the blocks should next hold '", next < named.size() ? named[next].key() : "nothing",
                        "'; the blocks must hold every parameter once, in the model's parameter order");
      if (p.requires_grad()) open.params.push_back({named[next].key(), p, static_cast<int64_t>(next)});
      open_until = std::max(open_until, last_use.at(p.unsafeGetTensorImpl()));
      ++next;
    }
    open.blocks.push_back(block.name);
    if (numel(open.params) >= min_params && b >= open_until) plans.push_back(std::exchange(open, UnitPlan()));
  }
  if (!open.params.empty()) {
    if (plans.empty()) {
      plans.push_back(std::move(open));
    } else {
      UnitPlan& last = plans.back();
      last.blocks.insert(last.blocks.end(), open.blocks.begin(), open.blocks.end());
      last.params.insert(last.params.end(), open.params.begin(), open.params.end());
    }
  }
  TORCH_CHECK_VALUE(next == named.size(), "rank ", rank, ": fsdp cannot shard this model by its blocks: parameter '",
                    next < named.size() ? named[next].key() : "", "' is in none of them (every parameter must be in ",
                    "a block, see Note [Model blocks])");
  for (UnitPlan& plan : plans) {
    for (const std::string& b : plan.blocks) plan.name += (plan.name.empty() ? "" : "+") + b;
  }
  return plans;
}


FsdpStrategy::FsdpStrategy(torch::nn::AnyModule model, StrategyOptions options)
    : model_(std::move(model)),
      module_(model_.ptr()),
      classifier_(std::dynamic_pointer_cast<models::Classifier>(module_)),
      options_(std::move(options)),
      group_(sharding_group(options_, "fsdp", "the parameters")),
      guard_(&group_) {
  check_strategy_options(options_);
  TORCH_CHECK_VALUE(options_.fsdp().min_params() >= 0, "rank ", group_.rank(), ": FsdpOptions::min_params ",
                    options_.fsdp().min_params(), " must be >= 0 (0: one unit per block of the model)");
  if (options_.profiler() == nullptr)
    disabled_profiler_ = std::make_unique<StepProfiler>(StepProfilerOptions().enabled(false));
  profiler_ = options_.profiler() ? options_.profiler() : disabled_profiler_.get();

  sync_module_states(*module_, group_);  // every rank starts from rank 0's weights
  build_units();
  std::vector<torch::Tensor> shards;
  for (const auto& unit : units_) shards.push_back(unit->shard());
  optimizer_ = options_.optimizer()(shards);
  amp::AmpOptions a = amp::AmpOptions().dtype(options_.half_dtype()).group(&group_);
  if (options_.loss_scale()) a.loss_scale(*options_.loss_scale());
  amp_ = std::make_unique<amp::Amp>(amp::initialize(*module_, *optimizer_, options_.opt_level(), a));
}

FsdpStrategy::~FsdpStrategy() {
  if (classifier_) classifier_->set_block_runner(nullptr);
}

void FsdpStrategy::build_units() {
  std::vector<UnitPlan> plans;
  if (classifier_) {
    plans = plan_units(*module_, classifier_->blocks(), options_.fsdp().min_params(), group_.rank());
  } else {
    plans.push_back(UnitPlan{"model", {}, trainable_parameters(*module_)});
  }
  const int64_t model_params = static_cast<int64_t>(module_->parameters().size());
  for (UnitPlan& plan : plans) {
    if (plan.params.empty()) continue;  // all frozen: see Note [Frozen parameters]
    units_.push_back(std::make_unique<FsdpUnit>(plan.name, plan.params, model_params, group_, kBucketCapBytes));
    for (size_t b = 0; b < plan.blocks.size(); ++b)
      places_[plan.blocks[b]] = BlockPlace{units_.size() - 1, b == 0, b + 1 == plan.blocks.size()};
  }
  TORCH_CHECK_VALUE(!units_.empty(), "rank ", group_.rank(), ": fsdp: the model has no trainable parameters to ",
                    "shard (all ", model_params, " have requires_grad false); unfreeze the ones to train");
  if (classifier_)
    classifier_->set_block_runner([this](const models::Block& block, const torch::Tensor& x) { return run_block(block, x); });
}

torch::Tensor FsdpStrategy::run_block(const models::Block& block, const torch::Tensor& x) {
  const auto it = places_.find(block.name);
  if (it == places_.end()) return block.forward(x);  // no parameters: nothing to gather
  const BlockPlace& place = it->second;
  if (place.first) {
    units_[place.unit]->gather();
    prefetch(place.unit + 1);
  }
  torch::Tensor y = block.forward(x);
  if (place.last) after_unit_forward(place.unit, y);
  return y;
}

torch::Tensor FsdpStrategy::run_model(const torch::Tensor& x) {
  reshard_every_unit();  // Note [FSDP prefetch]: a forward starts from the shards
  if (classifier_) return model_.forward(x);  // unit by unit, through run_block
  units_.front()->gather();
  torch::Tensor y = model_.forward(x);
  after_unit_forward(0, y);
  return y;
}

// See Note [FSDP units]: the hook runs when the gradient of the unit's output is complete, before
// any operation of the unit's backward.
void FsdpStrategy::after_unit_forward(size_t index, const torch::Tensor& output) {
  FsdpUnit& unit = *units_[index];
  const bool backward_follows = torch::GradMode::is_enabled() && output.requires_grad();
  if (backward_follows) {
    torch::Tensor hooked = output;
    hooked.register_hook([this, index](const torch::Tensor&) {
      units_[index]->gather();
      if (index > 0) prefetch(index - 1);
    });
  }
  if (!backward_follows || options_.fsdp().reshard_after_forward()) unit.reshard();
}

// Note [FSDP prefetch]
// A unit's all-gather on the calling thread leaves the core idle while the shards travel, and
// every such gather is a meeting of all ranks: the faster rank waits for the slower one at each
// unit, twice a step. With prefetch, the unit that runs next is gathered on the group's worker
// while this one computes: in forward, unit u+1 once unit u has its parameters; in backward, unit
// u-1 once unit u's backward begins (its output's gradient hook). When that unit's turn comes,
// gather() only waits for what is already under way, and a rank that is ahead no longer waits at
// every unit. The order of collectives stays the same on every rank, as the schedule is the
// model's own. The price is memory: two neighbouring units are gathered at once, which the memory
// report and plan count. A prefetched unit that is not used after all (a backward that does not
// reach it) is still gathered when the next forward or optimizer step begins: both reshard every
// unit first, so no forward sees stale weights and no step changes a shard that an all-gather is
// still reading.
void FsdpStrategy::prefetch(size_t index) {
  if (options_.fsdp().prefetch() && index < units_.size()) units_[index]->prefetch();
}

void FsdpStrategy::reshard_every_unit() {
  for (const auto& unit : units_) unit->reshard();
}

double FsdpStrategy::forward_backward(const std::vector<MicroBatch>& micro_batches, const LossFunction& loss_fn) {
  TORCH_CHECK_VALUE(!micro_batches.empty(), name(), ": a step needs at least one micro-batch");
  for (const auto& unit : units_) unit->grad_shard().zero_();
  double total = 0.0;
  // See Note [FSDP units]: the forward gathers each unit, the backward gathers it again and
  // reduce-scatters its gradient.
  auto forward = [this](const torch::Tensor& x) { return run_model(x); };
  for (size_t i = 0; i < micro_batches.size(); ++i)
    total += run_micro_batch(micro_batches[i], loss_fn, forward, *amp_, *profiler_, guard_, total,
                             i + 1 == micro_batches.size());
  return total;
}

StepDecision FsdpStrategy::step() {
  auto phase = profiler_->scope(Phase::kOptimizer);
  reshard_every_unit();  // Note [FSDP prefetch]: no all-gather still reads a shard the step changes
  std::vector<torch::Tensor> grad_shards;
  for (const auto& unit : units_) grad_shards.push_back(unit->grad_shard());
  return step_shards(guard_, *amp_, group_, options_, grad_shards);
}

torch::Tensor FsdpStrategy::forward(const torch::Tensor& input) {
  return amp_->cast_output(run_model(amp_->cast_input(input)));
}

double FsdpStrategy::loss_scale() const {
  return amp_->grad_scaler().is_enabled() ? amp_->grad_scaler().get_scale() : 0.0;
}

c10::Dict<std::string, torch::Tensor> FsdpStrategy::model_state_dict() {
  torch::NoGradGuard no_grad;
  std::unordered_map<const void*, torch::Tensor> full;  // parameter TensorImpl -> gathered copy
  for (const auto& unit : units_) {
    unit->gather();
    for (const torch::Tensor& p : unit->flat().params()) full.emplace(p.unsafeGetTensorImpl(), p.detach().clone());
    unit->reshard();
  }
  c10::Dict<std::string, torch::Tensor> weights;
  for (const auto& [key, t] : models::state_dict(*module_)) {
    auto it = full.find(t.unsafeGetTensorImpl());
    weights.insert(key, it != full.end() ? it->second : t.detach().clone());
  }
  return weights;
}

std::vector<const FlatParameters*> FsdpStrategy::flats() const {
  std::vector<const FlatParameters*> out;
  for (const auto& unit : units_) out.push_back(&unit->flat());
  return out;
}

c10::impl::GenericDict FsdpStrategy::training_state_dict() {
  return sharded_training_state_dict(*optimizer_, flats(), group_, amp_->grad_scaler());
}

void FsdpStrategy::load_training_state_dict(const c10::impl::GenericDict& state, const std::string& source) {
  load_sharded_training_state_dict(*optimizer_, flats(), amp_->grad_scaler(), state, source);
}

std::vector<ShardLayout> FsdpStrategy::layouts() const {
  std::vector<ShardLayout> out;
  for (const auto& unit : units_) out.push_back(shard_layout(unit->name(), unit->flat()));
  return out;
}

std::vector<torch::Tensor> FsdpStrategy::shards() const {
  std::vector<torch::Tensor> out;
  for (const auto& unit : units_) out.push_back(unit->shard());
  return out;
}

// See Note [Sharded state]: the shards are what the optimizer steps, so they are the parameters.
std::optional<ShardedState> FsdpStrategy::sharded_state_dict() {
  return make_sharded_state(layouts(), shards(), *optimizer_, amp_->grad_scaler(), *module_, group_);
}

void FsdpStrategy::load_sharded_state_dict(const ShardedState& state, const std::string& source) {
  load_sharded_state(state, layouts(), shards(), *optimizer_, amp_->grad_scaler(), *module_, group_, source);
}

MemoryReport FsdpStrategy::memory() const {
  MemoryReport m;
  int64_t gathered = 0;  // at most: one unit, or two neighbours with prefetch (Note [FSDP prefetch])
  for (size_t u = 0; u < units_.size(); ++u) {
    m.param_bytes += tensor_bytes(units_[u]->shard());
    m.grad_bytes += tensor_bytes(units_[u]->grad_shard());
    const bool pair = options_.fsdp().prefetch() && u + 1 < units_.size();
    gathered = std::max(gathered, units_[u]->full_bytes() + (pair ? units_[u + 1]->full_bytes() : 0));
  }
  m.param_bytes += gathered + frozen_parameter_bytes(*module_);  // Note [Frozen parameters]
  m.optim_bytes = optim::optimizer_state_bytes(*optimizer_);
  return m;
}

}  // namespace lockstep::parallel
