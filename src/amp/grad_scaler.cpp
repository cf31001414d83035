#include "lockstep/amp/grad_scaler.h"

#include <cmath>

namespace lockstep::amp {
namespace {

const char* const kKeys[] = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"};

// `where` names the caller; `scale` names the scale's key there (init_scale or scale).
void validate(const GradScalerOptions& o, const char* where, const char* scale) {
  TORCH_CHECK(o.init_scale() > 0 && std::isfinite(o.init_scale()), where, ": ", scale,
              " must be a positive finite number, got ", o.init_scale());
  TORCH_CHECK(o.growth_factor() > 1.0, where, ": growth_factor must be > 1, got ", o.growth_factor());
  TORCH_CHECK(o.backoff_factor() > 0.0 && o.backoff_factor() < 1.0, where,
              ": backoff_factor must be in (0, 1), got ", o.backoff_factor());
  TORCH_CHECK(o.growth_interval() >= 1, where, ": growth_interval must be >= 1, got ", o.growth_interval());
}

const c10::IValue& entry(const StateDict& state, const std::string& key) {
  auto it = state.find(key);
  TORCH_CHECK(it != state.end(), "GradScaler::load_state_dict: missing key '", key,
              "'; a GradScaler state_dict has scale, growth_factor, backoff_factor, growth_interval and "
              "_growth_tracker");
  return it->value();
}

double as_double(const StateDict& state, const std::string& key) {
  const c10::IValue& v = entry(state, key);
  TORCH_CHECK(v.isDouble() || v.isInt(), "GradScaler::load_state_dict: '", key, "' must be a number, got ",
              v.tagKind());
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

int64_t as_int(const StateDict& state, const std::string& key) {
  const c10::IValue& v = entry(state, key);
  TORCH_CHECK(v.isInt(), "GradScaler::load_state_dict: '", key, "' must be an int, got ", v.tagKind());
  return v.toInt();
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options)
    : options_(options), scale_(static_cast<float>(options.init_scale())) {
  if (options_.enabled()) validate(options_, "GradScaler", "init_scale");
}

torch::Tensor GradScaler::scale(const torch::Tensor& outputs) const {
  if (!options_.enabled()) return outputs;
  // Python multiplies by an fp32 tensor, promoting half outputs to fp32; so do we, keeping the shape.
  return outputs.to(at::promote_types(outputs.scalar_type(), torch::kFloat)) * static_cast<double>(scale_);
}

// Note [Inf checks across ranks]: ranks' gradients can differ (no DDP, or a sharded optimizer that
// sees only its shard), so one rank may find an inf that another does not. Deciding alone, one rank
// would skip the step while another takes it and their parameters and scales would drift apart for
// good. So with a group, the found-inf flag is all-reduced with Max before anyone decides: one fp32
// number (Gloo cannot reduce bool) per optimizer per step. Every rank must call unscale_ or step
// for the same optimizers in the same order.
void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) return;
  PerOptimizer& state = per_optimizer_[&optimizer];
  TORCH_CHECK(state.stage != Stage::kUnscaled,
              "unscale_() has already been called on this optimizer since the last update().");
  TORCH_CHECK(state.stage != Stage::kStepped, "unscale_() is being called after step().");

  torch::NoGradGuard no_grad;
  // PyTorch's inverse: 1/scale in double, rounded to fp32.
  const double inv_scale = static_cast<float>(1.0 / static_cast<double>(scale_));
  std::vector<torch::Tensor> finite;  // one 0-dim bool per gradient, read back once below
  for (auto& param_group : optimizer.param_groups()) {
    for (auto& p : param_group.params()) {
      if (!p.grad().defined()) continue;
      finite.push_back(torch::isfinite(p.grad()).all());
      p.mutable_grad().mul_(inv_scale);
    }
  }
  dist::ProcessGroup* group = options_.group();
  // With a group, a rank whose optimizer holds no gradient (a shard of a sharded optimizer) still
  // joins the vote; checking here would leave the other ranks waiting in the all-reduce.
  TORCH_CHECK(!finite.empty() || group != nullptr, "GradScaler: no parameter of the optimizer has a gradient",
              "; call scaler.scale(loss).backward() before unscale_() or step()");
  torch::Tensor found_inf = finite.empty() ? torch::zeros({1})
                                           : torch::stack(finite).all().logical_not().to(torch::kFloat).reshape({1});
  if (group != nullptr) group->all_reduce(found_inf, dist::ReduceOp::kMax);
  state.found_inf = found_inf.item<float>() > 0;
  state.stage = Stage::kUnscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return true;
  }
  PerOptimizer& state = per_optimizer_[&optimizer];
  TORCH_CHECK(state.stage != Stage::kStepped, "step() has already been called since the last update().");
  if (state.stage == Stage::kReady) unscale_(optimizer);
  const bool stepping = !state.found_inf;
  if (stepping) optimizer.step();
  state.stage = Stage::kStepped;
  return stepping;
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  TORCH_CHECK(!per_optimizer_.empty(),
              "No inf checks were recorded prior to update(): call step(optimizer) first");
  bool found_inf = false;
  for (const auto& entry : per_optimizer_) found_inf = found_inf || entry.second.found_inf;
  // torch._amp_update_scale_, in its fp32 arithmetic.
  if (found_inf) {
    scale_ = static_cast<float>(scale_ * options_.backoff_factor());
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval()) {
    const float grown = static_cast<float>(scale_ * options_.growth_factor());
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled()) return;
  TORCH_CHECK(new_scale > 0 && std::isfinite(new_scale),
              "GradScaler::update: new_scale must be a positive finite number, got ", new_scale);
  scale_ = static_cast<float>(new_scale);
  per_optimizer_.clear();
}

double GradScaler::get_scale() const { return options_.enabled() ? scale_ : 1.0; }

int64_t GradScaler::get_growth_tracker() const { return options_.enabled() ? growth_tracker_ : 0; }

StateDict GradScaler::state_dict() const {
  StateDict state(c10::StringType::get(), c10::AnyType::get());
  if (!options_.enabled()) return state;
  state.insert(kKeys[0], static_cast<double>(scale_));
  state.insert(kKeys[1], options_.growth_factor());
  state.insert(kKeys[2], options_.backoff_factor());
  state.insert(kKeys[3], options_.growth_interval());
  state.insert(kKeys[4], growth_tracker_);
  return state;
}

void GradScaler::load_state_dict(const StateDict& state) {
  if (!options_.enabled()) return;
  TORCH_CHECK(state.size() > 0, "The source state dict is empty, possibly because it was saved from a disabled "
              "instance of GradScaler.");
  GradScalerOptions loaded = options_;
  loaded.init_scale(as_double(state, kKeys[0]))
      .growth_factor(as_double(state, kKeys[1]))
      .backoff_factor(as_double(state, kKeys[2]))
      .growth_interval(as_int(state, kKeys[3]));
  const int64_t tracker = as_int(state, kKeys[4]);
  validate(loaded, "GradScaler::load_state_dict", "scale");
  TORCH_CHECK(tracker >= 0 && tracker < loaded.growth_interval(), "GradScaler::load_state_dict: '_growth_tracker' ",
              tracker, " must be in [0, growth_interval = ", loaded.growth_interval(), ")");
  options_ = loaded;
  scale_ = static_cast<float>(loaded.init_scale());
  growth_tracker_ = tracker;
}

}  // namespace lockstep::amp
