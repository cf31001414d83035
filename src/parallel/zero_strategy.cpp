#include "lockstep/parallel/zero_strategy.h"

#include <torch/torch.h>

#include <cmath>

#include "lockstep/models/state_dict.h"
#include "lockstep/optim/state_dict.h"
#include "lockstep/parallel/distributed_data_parallel.h"
#include "lockstep/parallel/shard_state_dict.h"

namespace lockstep::parallel {
namespace {

int64_t bytes(const torch::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

dist::ProcessGroup& required_group(const StrategyOptions& options, const ZeroOptions& zero) {
  const std::string name = "zero" + std::to_string(zero.stage());
  TORCH_CHECK_VALUE(zero.stage() == 1 || zero.stage() == 2, "ZeroOptions().stage(", zero.stage(),
                    ") is not a ZeRO stage this strategy runs: 1 (optimizer state) or 2 (and gradients); "
                    "stage 3 is FSDP");
  TORCH_CHECK_VALUE(options.group() != nullptr, "the ", name,
                    " strategy shards the optimizer state across ranks and needs a process group: "
                    "StrategyOptions().group(...), or run under a launcher (lockstep run --nproc-per-node N); "
                    "one process trains with the local strategy");
  const amp::OptLevel level = options.opt_level();
  TORCH_CHECK_VALUE(level == amp::OptLevel::kO0 || level == amp::OptLevel::kO1, "rank ", options.group()->rank(),
                    ": the ", name, " strategy trains at O0 (fp32) and O1 (autocast), not ", amp::to_string(level),
                    ": use --opt-level O1, or the ddp strategy for O2 and O3");
  TORCH_CHECK_VALUE(zero.bucket_cap_mb() > 0 && std::isfinite(zero.bucket_cap_mb()), "bucket_cap_mb=",
                    zero.bucket_cap_mb(), " must be positive");
  return *options.group();
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
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const MicroBatch& micro_batch = micro_batches[i];
    torch::Tensor out, loss;
    {
      auto phase = profiler_->scope(Phase::kForward);
      auto autocast = amp_->autocast();
      out = amp_->cast_output(model_.forward(amp_->cast_input(micro_batch.input)));
    }
    {
      auto phase = profiler_->scope(Phase::kLoss);
      auto autocast = amp_->autocast();
      loss = loss_fn(out, micro_batch.target) * micro_batch.weight;
    }
    const double value = loss.item<double>();
    if (i + 1 == micro_batches.size()) guard_.start_vote(total + value);  // travels while the last backward runs
    {
      auto phase = profiler_->scope(Phase::kBackward);  // stage 2 reduce-scatters in here
      amp_->scale_loss(loss).backward();
    }
    total += value;
  }
  if (zero_.stage() == 1) {
    auto phase = profiler_->scope(Phase::kSync);
    torch::NoGradGuard no_grad;
    flat_grad_.div_(static_cast<double>(group_.size()));
    group_.reduce_scatter(grad_shard_, flat_grad_);  // the shard's range of the average, in place
  }
  return total;
}

// Each rank's squared shard norm in its slot, summed over ranks by one all-reduce: (N) fp64. The
// norms are fp32, as clip_grad_norm_ computes them; a non-finite slot names the rank whose shard
// holds the non-finite gradient.
torch::Tensor ZeroStrategy::squared_shard_norms() {
  torch::Tensor squares = torch::zeros({group_.size()}, torch::kDouble);
  squares[group_.rank()] = std::pow(grad_shard_.norm().item<double>(), 2);
  group_.all_reduce(squares);
  return squares;
}

StepDecision ZeroStrategy::step() {
  auto phase = profiler_->scope(Phase::kOptimizer);
  StepDecision d;
  d.skip_reason = guard_.verdict({});  // the losses; the gradient is checked over every shard below
  if (!d.skip_reason.empty()) return d;
  const bool scaling = amp_->grad_scaler().is_enabled();  // the scaler checks the shards itself
  double norm = NAN;  // of the whole model's gradient
  if (!scaling) {
    const torch::Tensor squares = squared_shard_norms();
    std::string ranks;
    for (int64_t r = 0; r < group_.size(); ++r)
      if (!std::isfinite(squares[r].item<double>())) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    if (!ranks.empty()) {
      d.skip_reason = "non-finite gradient (averaged over ranks) in the shard of rank " + ranks;
      return d;
    }
    norm = std::sqrt(squares.sum().item<double>());
  }
  if (options_.clip_value() > 0 || options_.clip_norm() > 0) {
    torch::NoGradGuard no_grad;
    amp_->unscale_();  // clip true gradients
    if (options_.clip_value() > 0) grad_shard_.clamp_(-options_.clip_value(), options_.clip_value());
    if (options_.clip_norm() > 0) {
      if (scaling || options_.clip_value() > 0) norm = std::sqrt(squared_shard_norms().sum().item<double>());
      // As torch.nn.utils.clip_grad_norm_, over the whole model's gradient.
      const double coefficient = options_.clip_norm() / (norm + 1e-6);
      if (coefficient < 1.0) grad_shard_.mul_(coefficient);
    }
  }
  d.stepped = amp_->step();
  if (options_.fixed_loss_scale()) {
    amp_->grad_scaler().update(options_.loss_scale()->init_scale());
  } else {
    amp_->update();
  }
  if (!d.stepped) {
    d.skip_reason = "non-finite gradient (loss scale overflow)";
    return d;
  }
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
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("optimizer", consolidated_optimizer_state_dict(*optimizer_, *flat_, group_));
  state.insert("scaler", amp_->grad_scaler().state_dict());
  return state;
}

void ZeroStrategy::load_training_state_dict(const c10::impl::GenericDict& state, const std::string& source) {
  auto entry = [&](const char* key) {
    auto it = state.find(key);
    TORCH_CHECK(it != state.end(), source, " has no '", key, "' state");
    return it->value();
  };
  load_sharded_optimizer_state_dict(*optimizer_, *flat_, entry("optimizer"), source);
  if (amp_->grad_scaler().is_enabled()) amp_->grad_scaler().load_state_dict(entry("scaler").toGenericDict());
}

MemoryReport ZeroStrategy::memory() const {
  MemoryReport m;
  m.param_bytes = bytes(flat_->flat());
  m.grad_bytes = zero_.stage() == 1 ? bytes(flat_grad_) : bytes(grad_shard_);
  m.optim_bytes = optim::optimizer_state_bytes(*optimizer_);
  return m;
}

}  // namespace lockstep::parallel
