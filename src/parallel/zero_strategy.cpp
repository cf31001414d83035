#include "lockstep/parallel/zero_strategy.h"

#include <torch/torch.h>

#include <cmath>

#include "lockstep/models/state_dict.h"
#include "lockstep/optim/state_dict.h"
#include "lockstep/parallel/distributed_data_parallel.h"
#include "lockstep/parallel/micro_batch.h"
#include "lockstep/parallel/shard_state_dict.h"
#include "lockstep/parallel/shard_step.h"

namespace lockstep::parallel {
namespace {

dist::ProcessGroup& required_group(const StrategyOptions& options, const ZeroOptions& zero) {
  const std::string name = "zero" + std::to_string(zero.stage());
  TORCH_CHECK_VALUE(zero.stage() == 1 || zero.stage() == 2, "ZeroOptions().stage(", zero.stage(),
                    ") is not a ZeRO stage this strategy runs: 1 (optimizer state) or 2 (and gradients); "
                    "stage 3 is FSDP");
  TORCH_CHECK_VALUE(zero.bucket_cap_mb() > 0 && std::isfinite(zero.bucket_cap_mb()), "bucket_cap_mb=",
                    zero.bucket_cap_mb(), " must be positive");
  return sharding_group(options, name, "the optimizer state");
}

}  // namespace

ZeroStrategy::ZeroStrategy(torch::nn::AnyModule model, StrategyOptions options, ZeroOptions zero)
    : model_(std::move(model)),
      module_(model_.ptr()),
      options_(std::move(options)),
      zero_(zero),
      group_(required_group(options_, zero_)),
      guard_(&group_) {
  check_strategy_options(options_);
  if (options_.profiler() == nullptr)
    disabled_profiler_ = std::make_unique<StepProfiler>(StepProfilerOptions().enabled(false));
  profiler_ = options_.profiler() ? options_.profiler() : disabled_profiler_.get();

  sync_module_states(*module_, group_);  // every rank starts from rank 0's weights
  flat_ = std::make_unique<FlatParameters>(*module_, group_.size(), group_.rank());
  torch::Tensor shard = flat_->shard();
  if (zero_.stage() == 1) {
    flat_grad_ = torch::zeros({flat_->padded_numel()}, torch::kFloat);
    const auto& params = flat_->params();
    for (size_t i = 0; i < params.size(); ++i) {
      torch::Tensor p = params[i];
      p.mutable_grad() = flat_grad_.narrow(0, flat_->offsets()[i], p.numel()).view(p.sizes()).detach();
    }
    grad_shard_ = flat_grad_.narrow(0, flat_->shard_begin(group_.rank()), flat_->shard_numel()).detach();
  } else {
    grad_shard_ = torch::zeros({flat_->shard_numel()}, torch::kFloat);
    reducer_ = std::make_unique<ShardReducer>(*flat_, grad_shard_, group_,
                                              static_cast<int64_t>(zero_.bucket_cap_mb() * 1024 * 1024));
  }
  shard.mutable_grad() = grad_shard_;
  optimizer_ = options_.optimizer()({shard});
  amp::AmpOptions a = amp::AmpOptions().dtype(options_.half_dtype()).group(&group_);
  if (options_.loss_scale()) a.loss_scale(*options_.loss_scale());
  amp_ = std::make_unique<amp::Amp>(amp::initialize(*module_, *optimizer_, options_.opt_level(), a));
}

ZeroStrategy::~ZeroStrategy() = default;

double ZeroStrategy::forward_backward(const std::vector<MicroBatch>& micro_batches, const LossFunction& loss_fn) {
  TORCH_CHECK_VALUE(!micro_batches.empty(), name(), ": a step needs at least one micro-batch");
  (zero_.stage() == 1 ? flat_grad_ : grad_shard_).zero_();
  double total = 0.0;
  auto forward = [this](const torch::Tensor& x) { return model_.forward(x); };  // stage 2 reduces in backward
  for (size_t i = 0; i < micro_batches.size(); ++i)
    total += run_micro_batch(micro_batches[i], loss_fn, forward, *amp_, *profiler_, guard_, total,
                             i + 1 == micro_batches.size());
  if (zero_.stage() == 1) {
    auto phase = profiler_->scope(Phase::kSync);
    torch::NoGradGuard no_grad;
    flat_grad_.div_(static_cast<double>(group_.size()));
    group_.reduce_scatter(grad_shard_, flat_grad_);  // the shard's range of the average, in place
  }
  return total;
}

StepDecision ZeroStrategy::step() {
  auto phase = profiler_->scope(Phase::kOptimizer);
  const StepDecision d = step_shards(guard_, *amp_, group_, options_, {grad_shard_});
  if (!d.stepped) return d;
  torch::NoGradGuard no_grad;
  torch::Tensor flat = flat_->flat();
  group_.all_gather_into(flat, flat_->shard());  // every rank's updated shard into every rank's weights
  return d;
}

torch::Tensor ZeroStrategy::forward(const torch::Tensor& input) {
  return amp_->cast_output(model_.forward(amp_->cast_input(input)));
}

double ZeroStrategy::loss_scale() const {
  return amp_->grad_scaler().is_enabled() ? amp_->grad_scaler().get_scale() : 0.0;
}

// Copies: the parameters are views of the flat buffer, and a saved view would carry all of it.
c10::Dict<std::string, torch::Tensor> ZeroStrategy::model_state_dict() {
  c10::Dict<std::string, torch::Tensor> weights;
  for (const auto& item : models::state_dict_to_dict(*module_)) weights.insert(item.key(), item.value().clone());
  return weights;
}

c10::impl::GenericDict ZeroStrategy::training_state_dict() {
  return sharded_training_state_dict(*optimizer_, {flat_.get()}, group_, amp_->grad_scaler());
}

void ZeroStrategy::load_training_state_dict(const c10::impl::GenericDict& state, const std::string& source) {
  load_sharded_training_state_dict(*optimizer_, {flat_.get()}, amp_->grad_scaler(), state, source);
}

// See Note [Sharded state]: ZeRO's one flat buffer is one unit, "model".
std::optional<ShardedState> ZeroStrategy::sharded_state_dict() {
  return make_sharded_state({shard_layout("model", *flat_)}, {flat_->shard()}, *optimizer_, amp_->grad_scaler(),
                            *module_, group_);
}

void ZeroStrategy::load_sharded_state_dict(const ShardedState& state, const std::string& source) {
  load_sharded_state(state, {shard_layout("model", *flat_)}, {flat_->shard()}, *optimizer_, amp_->grad_scaler(),
                     *module_, group_, source);
  torch::NoGradGuard no_grad;
  torch::Tensor flat = flat_->flat();
  group_.all_gather_into(flat, flat_->shard());  // every rank's loaded shard into every rank's weights
}

MemoryReport ZeroStrategy::memory() const {
  MemoryReport m;
  m.param_bytes = tensor_bytes(flat_->flat()) + frozen_parameter_bytes(*module_);  // Note [Frozen parameters]
  m.grad_bytes = zero_.stage() == 1 ? tensor_bytes(flat_grad_) : tensor_bytes(grad_shard_);
  m.optim_bytes = optim::optimizer_state_bytes(*optimizer_);
  return m;
}

}  // namespace lockstep::parallel
