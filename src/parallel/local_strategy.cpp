#include "lockstep/parallel/local_strategy.h"

#include <torch/torch.h>

#include "lockstep/models/state_dict.h"
#include "lockstep/optim/state_dict.h"
#include "lockstep/parallel/micro_batch.h"

namespace lockstep::parallel {

LocalStrategy::LocalStrategy(torch::nn::AnyModule model, StrategyOptions options)
    : model_(std::move(model)), module_(model_.ptr()), options_(std::move(options)), guard_(options_.group().get()) {
  check_strategy_options(options_);
  if (options_.profiler() == nullptr)
    disabled_profiler_ = std::make_unique<StepProfiler>(StepProfilerOptions().enabled(false));
  profiler_ = options_.profiler() ? options_.profiler() : disabled_profiler_.get();
  optimizer_ = options_.optimizer()(module_->parameters());
  amp::AmpOptions a = amp::AmpOptions().dtype(options_.half_dtype()).group(options_.group().get());
  if (options_.loss_scale()) a.loss_scale(*options_.loss_scale());
  amp_ = std::make_unique<amp::Amp>(amp::initialize(*module_, *optimizer_, options_.opt_level(), a));
}

LocalStrategy::~LocalStrategy() = default;

double LocalStrategy::forward_backward(const std::vector<MicroBatch>& micro_batches, const LossFunction& loss) {
  TORCH_CHECK_VALUE(!micro_batches.empty(), name(), ": a step needs at least one micro-batch");
  amp_->zero_grad(/*set_to_none=*/true);  // as the peer does; see Amp::zero_grad
  double total = 0.0;
  for (size_t i = 0; i < micro_batches.size(); ++i)
    total += run_micro_batch(micro_batches[i], loss, total, i + 1 == micro_batches.size());
  return total;
}

double LocalStrategy::run_micro_batch(const MicroBatch& micro_batch, const LossFunction& loss_fn,
                                      double loss_before, bool last) {
  return parallel::run_micro_batch(micro_batch, loss_fn, [this](const torch::Tensor& x) { return replica_forward(x); },
                                   *amp_, *profiler_, guard_, loss_before, last);
}

StepDecision LocalStrategy::step() {
  auto phase = profiler_->scope(Phase::kOptimizer);
  // With loss scaling the scaler finds non-finite gradients itself (and backs the scale off).
  std::vector<torch::Tensor> gradients;
  if (!amp_->grad_scaler().is_enabled())
    for (const auto& p : module_->parameters()) gradients.push_back(p.grad());
  StepDecision d;
  d.skip_reason = guard_.verdict(gradients);
  if (!d.skip_reason.empty()) return d;
  if (options_.clip_value() > 0 || options_.clip_norm() > 0) {
    amp_->unscale_();  // clip true gradients, in fp32 at O2
    if (options_.clip_value() > 0) torch::nn::utils::clip_grad_value_(amp_->master_params(), options_.clip_value());
    if (options_.clip_norm() > 0) torch::nn::utils::clip_grad_norm_(amp_->master_params(), options_.clip_norm());
  }
  d.stepped = amp_->step();
  if (options_.fixed_loss_scale()) {
    amp_->grad_scaler().update(options_.loss_scale()->init_scale());
  } else {
    amp_->update();
  }
  if (!d.stepped) d.skip_reason = "non-finite gradient (loss scale overflow)";
  return d;
}

torch::Tensor LocalStrategy::forward(const torch::Tensor& input) {
  return amp_->cast_output(replica_forward(amp_->cast_input(input)));
}

double LocalStrategy::loss_scale() const {
  return amp_->grad_scaler().is_enabled() ? amp_->grad_scaler().get_scale() : 0.0;
}

// O2's half parameters are replaced by their fp32 masters, so a checkpoint resumes exactly and
// saved models are fp32 as usual. O3 has no masters: its files hold the half weights it trains.
c10::Dict<std::string, torch::Tensor> LocalStrategy::model_state_dict() {
  c10::Dict<std::string, torch::Tensor> weights = models::state_dict_to_dict(*module_);
  const auto params = module_->named_parameters();
  for (size_t i = 0; i < params.size(); ++i)
    weights.insert_or_assign(params[i].key(), amp_->master_params()[i].detach().cpu());
  return weights;
}

c10::impl::GenericDict LocalStrategy::training_state_dict() {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("optimizer", optim::optimizer_state_dict(*optimizer_));
  state.insert("scaler", amp_->grad_scaler().state_dict());
  return state;
}

void LocalStrategy::load_training_state_dict(const c10::impl::GenericDict& state, const std::string& source) {
  auto entry = [&](const char* key) {
    auto it = state.find(key);
    TORCH_CHECK(it != state.end(), source, " has no '", key, "' state");
    return it->value();
  };
  optim::load_optimizer_state_dict(*optimizer_, entry("optimizer"), source);
  if (amp_->grad_scaler().is_enabled()) amp_->grad_scaler().load_state_dict(entry("scaler").toGenericDict());
}

MemoryReport LocalStrategy::memory() const {
  MemoryReport m;
  const auto params = module_->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    m.param_bytes += tensor_bytes(params[i]);
    m.grad_bytes += tensor_bytes(params[i].grad());
    const torch::Tensor& master = amp_->master_params()[i];
    if (!master.is_same(params[i])) {
      m.optim_bytes += tensor_bytes(master);
      m.grad_bytes += tensor_bytes(master.grad());
    }
  }
  m.optim_bytes += optim::optimizer_state_bytes(*optimizer_);
  return m;
}

}  // namespace lockstep::parallel
