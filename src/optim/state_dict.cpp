#include "lockstep/optim/state_dict.h"

#include <c10/util/StringUtil.h>
#include <c10/util/Type.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <typeinfo>
#include <utility>

// Note [Optimizer state layout]
// Python's optimizer.state_dict() names parameters by position, not by tensor: they are numbered
// 0, 1, ... through the param groups in order, each group lists its numbers under "params", and
// "state" maps a number to that parameter's buffers (a parameter that never had a gradient has no
// entry). LibTorch keys its state by the parameter's TensorImpl address instead, so the numbering
// is made here, both ways, from param_groups()' order. Loading pairs the i-th number listed in the
// saved groups with the i-th parameter of this optimizer, as Python does: the numbers are names.
// What torch 2.14 writes, per kind:
//   sgd    state {"momentum_buffer"} (None in Python without momentum); group lr, momentum,
//          dampening, weight_decay, nesterov, and in Python also maximize, foreach,
//          differentiable, fused. lockstep writes the first five, as its checkpoints always have
//          (Python's load_state_dict gives the missing flags their defaults), and reads either.
//   adam   state {"step", "exp_avg", "exp_avg_sq", and "max_exp_avg_sq" with amsgrad}; group lr,
//          betas (a tuple), eps, weight_decay, amsgrad, maximize, foreach, capturable,
//          differentiable, fused, decoupled_weight_decay (False).
//   adamw  the same, with decoupled_weight_decay True. (1.13's AdamW wrote fewer flags, in
//          another order: lockstep reads those files too.)
// step: Python keeps a float32 0-dim tensor, LibTorch an int64 field. It is written as Python
// writes it (exact up to 2^24 steps, where Python's own float32 counter stops counting too) and
// read from a tensor, an int or a float holding a whole number.
// The flags LibTorch lacks are written with Python's defaults. On load, maximize=True is refused
// (LibTorch cannot ascend), and so is a decoupled_weight_decay that names the other kind; foreach,
// capturable, differentiable and fused only choose which of Python's kernels runs, not the
// update, and are ignored.


namespace lockstep::optim {
namespace {

using c10::IValue;
using GenericDict = c10::impl::GenericDict;
using ParamState = torch::optim::OptimizerParamState;
using TensorDict = c10::Dict<std::string, torch::Tensor>;
using TorchOptions = torch::optim::OptimizerOptions;

GenericDict string_dict() { return GenericDict(c10::StringType::get(), c10::AnyType::get()); }

// LibTorch's key for a parameter's entry in Optimizer::state().
void* state_key(const torch::Tensor& param) { return param.unsafeGetTensorImpl(); }

GenericDict as_dict(const IValue& v, const std::string& where) {
  TORCH_CHECK(v.isGenericDict(), where, " is not a dict but a ", v.tagKind());
  return v.toGenericDict();
}

IValue entry(const GenericDict& dict, const std::string& key, const std::string& where) {
  auto it = dict.find(key);
  TORCH_CHECK(it != dict.end(), where, " has no '", key, "' entry");
  return it->value();
}

double number(const GenericDict& dict, const std::string& key, const std::string& where) {
  const IValue v = entry(dict, key, where);
  TORCH_CHECK(v.isDouble() || v.isInt(), where, ": '", key, "' must be a number, got ", v.tagKind());
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

bool boolean(const GenericDict& dict, const std::string& key, const std::string& where) {
  const IValue v = entry(dict, key, where);
  TORCH_CHECK(v.isBool(), where, ": '", key, "' must be True or False, got ", v.tagKind());
  return v.toBool();
}

// Python's betas: a tuple (or, after a JSON round trip, a list) of two numbers.
std::pair<double, double> betas(const GenericDict& dict, const std::string& where) {
  const IValue v = entry(dict, "betas", where);
  std::vector<IValue> items;
  if (v.isTuple()) items = v.toTupleRef().elements().vec();
  if (v.isList()) items = v.toListRef().vec();
  TORCH_CHECK(items.size() == 2 && (items[0].isDouble() || items[0].isInt()) &&
                  (items[1].isDouble() || items[1].isInt()),
              where, ": 'betas' must be a pair of numbers, got ", v);
  return {items[0].toScalar().toDouble(), items[1].toScalar().toDouble()};
}

// A saved state tensor for `param`, converted to its dtype and device (a copy, never an alias of
// the saved dict's tensor).
torch::Tensor param_tensor(const IValue& v, const std::string& key, const torch::Tensor& param,
                           const std::string& where) {
  TORCH_CHECK(v.isTensor(), where, ": '", key, "' must be a tensor, got ", v.tagKind());
  const torch::Tensor t = v.toTensor();
  TORCH_CHECK(t.sizes() == param.sizes(), where, ": '", key, "' has shape ", t.sizes(),
              " but the parameter has shape ", param.sizes(), " (was it saved from a different model?)");
  return t.detach().to(torch::TensorOptions().dtype(param.dtype()).device(param.device()),
                       /*non_blocking=*/false, /*copy=*/true);
}

int64_t step_count(const IValue& v, const std::string& where) {
  double step = -1;
  if (v.isTensor()) {
    TORCH_CHECK(v.toTensor().numel() == 1, where, ": 'step' must hold one number, got shape ",
                v.toTensor().sizes());
    step = v.toTensor().item<double>();
  } else if (v.isInt()) {
    step = static_cast<double>(v.toInt());
  } else if (v.isDouble()) {
    step = v.toDouble();
  } else {
    TORCH_CHECK(false, where, ": 'step' must be a tensor or a number, got ", v.tagKind());
  }
  TORCH_CHECK(std::isfinite(step) && step >= 0 && step == std::floor(step), where,
              ": 'step' must be a whole number >= 0, got ", step);
  return static_cast<int64_t>(step);
}

torch::Tensor saved_copy(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

// The lockstep options a saved group describes, checked by the same rules as make_optimizer's.
OptimizerOptions options_from_group(OptimizerKind kind, const GenericDict& group, const std::string& where) {
  OptimizerOptions o(kind, number(group, "lr", where));
  o.weight_decay(number(group, "weight_decay", where));
  if (kind == OptimizerKind::kSGD) {
    o.momentum(number(group, "momentum", where)).nesterov(boolean(group, "nesterov", where));
  } else {
    const auto [beta1, beta2] = betas(group, where);
    o.beta1(beta1).beta2(beta2).eps(number(group, "eps", where)).amsgrad(boolean(group, "amsgrad", where));
  }
  TORCH_CHECK(!group.contains("maximize") || !boolean(group, "maximize", where), where,
              " has maximize=True, which LibTorch's ", to_string(kind),
              " cannot do; negate the loss instead");
  // PyTorch 2.x's Adam with decoupled_weight_decay=True is AdamW, and AdamW's False is Adam.
  if (kind != OptimizerKind::kSGD && group.contains("decoupled_weight_decay")) {
    const bool decoupled = boolean(group, "decoupled_weight_decay", where);
    TORCH_CHECK(decoupled == (kind == OptimizerKind::kAdamW), where, " has decoupled_weight_decay=",
                decoupled ? "True" : "False", ", which makes it ", decoupled ? "adamw" : "adam", "'s state; load it into ",
                decoupled ? "adamw" : "adam", ", not ", to_string(kind));
  }
  try {
    o.validate();
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, where, ": ", e.what_without_backtrace());
  }
  return o;
}

// How one kind's LibTorch options and per-parameter state map to Python's dicts.
struct Codec {
  OptimizerKind kind;
  std::function<GenericDict(const TorchOptions&)> write_group;  // without "params"
  std::function<std::unique_ptr<TorchOptions>(const GenericDict&, const std::string& where)> read_group;
  std::function<TensorDict(const ParamState&)> write_state;
  std::function<std::unique_ptr<ParamState>(const GenericDict&, const torch::Tensor& param,
                                            const TorchOptions& group, const std::string& where)>
      read_state;
  std::function<std::vector<torch::Tensor>(const ParamState&)> state_tensors;  // the defined ones
};

Codec sgd_codec() {
  using torch::optim::SGDOptions;
  using torch::optim::SGDParamState;
  Codec c;
  c.kind = OptimizerKind::kSGD;
  c.write_group = [](const TorchOptions& options) {
    const auto& o = static_cast<const SGDOptions&>(options);
    GenericDict g = string_dict();
    g.insert("lr", o.lr());
    g.insert("momentum", o.momentum());
    g.insert("dampening", o.dampening());
    g.insert("weight_decay", o.weight_decay());
    g.insert("nesterov", o.nesterov());
    return g;
  };
  c.read_group = [](const GenericDict& group, const std::string& where) -> std::unique_ptr<TorchOptions> {
    std::unique_ptr<TorchOptions> o = make_torch_options(options_from_group(OptimizerKind::kSGD, group, where));
    auto& sgd = static_cast<SGDOptions&>(*o);
    const double dampening = number(group, "dampening", where);
    TORCH_CHECK(std::isfinite(dampening) && dampening >= 0, where, ": dampening must be a finite number >= 0, got ",
                dampening);
    TORCH_CHECK(!sgd.nesterov() || dampening == 0, where, ": nesterov needs dampening 0, got ", dampening);
    sgd.dampening(dampening);
    return o;
  };
  c.write_state = [](const ParamState& state) {
    const auto& s = static_cast<const SGDParamState&>(state);
    TensorDict d;
    if (s.momentum_buffer().defined()) d.insert("momentum_buffer", saved_copy(s.momentum_buffer()));
    return d;
  };
  c.read_state = [](const GenericDict& saved, const torch::Tensor& param, const TorchOptions&,
                    const std::string& where) -> std::unique_ptr<ParamState> {
    auto s = std::make_unique<SGDParamState>();
    for (const auto& item : saved) {
      const std::string key = item.key().isString() ? item.key().toStringRef() : "";
      TORCH_CHECK(key == "momentum_buffer", where, " has '", item.key(),
                  "', which sgd's state does not have (is it another optimizer's state?)");
      if (!item.value().isNone()) s->momentum_buffer(param_tensor(item.value(), key, param, where));
    }
    return s;
  };
  c.state_tensors = [](const ParamState& state) {
    const auto& s = static_cast<const SGDParamState&>(state);
    std::vector<torch::Tensor> out;
    if (s.momentum_buffer().defined()) out.push_back(s.momentum_buffer());
    return out;
  };
  return c;
}

template <typename Options, typename State>  // (AdamOptions, AdamParamState) or the AdamW pair
Codec adam_codec(OptimizerKind kind) {
  Codec c;
  c.kind = kind;
  c.write_group = [kind](const TorchOptions& options) {
    const auto& o = static_cast<const Options&>(options);
    GenericDict g = string_dict();
    g.insert("lr", o.lr());
    g.insert("betas", c10::ivalue::Tuple::create(std::get<0>(o.betas()), std::get<1>(o.betas())));
    g.insert("eps", o.eps());
    g.insert("weight_decay", o.weight_decay());
    g.insert("amsgrad", o.amsgrad());
    g.insert("maximize", false);
    g.insert("foreach", IValue());
    g.insert("capturable", false);
    g.insert("differentiable", false);
    g.insert("fused", IValue());
    g.insert("decoupled_weight_decay", kind == OptimizerKind::kAdamW);
    return g;
  };
  c.read_group = [kind](const GenericDict& group, const std::string& where) -> std::unique_ptr<TorchOptions> {
    return make_torch_options(options_from_group(kind, group, where));
  };
  c.write_state = [](const ParamState& state) {
    const auto& s = static_cast<const State&>(state);
    TensorDict d;
    d.insert("step", torch::scalar_tensor(static_cast<double>(s.step()), torch::kFloat));
    d.insert("exp_avg", saved_copy(s.exp_avg()));
    d.insert("exp_avg_sq", saved_copy(s.exp_avg_sq()));
    if (s.max_exp_avg_sq().defined()) d.insert("max_exp_avg_sq", saved_copy(s.max_exp_avg_sq()));
    return d;
  };
  c.read_state = [kind](const GenericDict& saved, const torch::Tensor& param, const TorchOptions& group,
                        const std::string& where) -> std::unique_ptr<ParamState> {
    static const std::set<std::string> kKeys = {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    for (const auto& item : saved)
      TORCH_CHECK(item.key().isString() && kKeys.count(item.key().toStringRef()), where, " has '", item.key(),
                  "', which ", to_string(kind), "'s state does not have (is it another optimizer's state?)");
    auto s = std::make_unique<State>();
    s->step(step_count(entry(saved, "step", where), where));
    s->exp_avg(param_tensor(entry(saved, "exp_avg", where), "exp_avg", param, where));
    s->exp_avg_sq(param_tensor(entry(saved, "exp_avg_sq", where), "exp_avg_sq", param, where));
    if (saved.contains("max_exp_avg_sq")) {
      s->max_exp_avg_sq(param_tensor(saved.at("max_exp_avg_sq"), "max_exp_avg_sq", param, where));
    } else {
      TORCH_CHECK(!static_cast<const Options&>(group).amsgrad(), where,
                  " has no 'max_exp_avg_sq' entry, which its group's amsgrad=True needs");
    }
    return s;
  };
  c.state_tensors = [](const ParamState& state) {
    const auto& s = static_cast<const State&>(state);
    std::vector<torch::Tensor> out;
    for (const torch::Tensor& t : {s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()})
      if (t.defined()) out.push_back(t);
    return out;
  };
  return c;
}

// The codec for the optimizer's class; `what` names the caller in the error for other classes.
const Codec& codec_for(const torch::optim::Optimizer& optimizer, const char* what) {
  static const Codec sgd = sgd_codec();
  static const Codec adam = adam_codec<torch::optim::AdamOptions, torch::optim::AdamParamState>(OptimizerKind::kAdam);
  static const Codec adamw =
      adam_codec<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(OptimizerKind::kAdamW);
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return sgd;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return adam;
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return adamw;
  TORCH_CHECK(false, what, " supports torch::optim::SGD, Adam and AdamW (lockstep's ", c10::Join(", ", optimizer_names()),
              "), not ", c10::demangle(typeid(optimizer).name()));
}

}  // namespace

// See Note [Optimizer state layout].
c10::IValue optimizer_state_dict(const torch::optim::Optimizer& optimizer) {
  const Codec& codec = codec_for(optimizer, "optimizer_state_dict");
  c10::Dict<int64_t, TensorDict> state;
  c10::impl::GenericList groups(c10::DictType::create(c10::StringType::get(), c10::AnyType::get()));
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    c10::List<int64_t> params;
    for (const auto& p : group.params()) {
      auto it = optimizer.state().find(state_key(p));
      if (it != optimizer.state().end()) state.insert(index, codec.write_state(*it->second));
      params.push_back(index++);
    }
    GenericDict g = codec.write_group(group.options());
    g.insert("params", params);
    groups.push_back(g);
  }
  GenericDict out = string_dict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

// See Note [Optimizer state layout].
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::IValue& value,
                               const std::string& source) {
  const Codec& codec = codec_for(optimizer, "load_optimizer_state_dict");
  const std::string kind = to_string(codec.kind);
  const GenericDict dict = as_dict(value, source + " optimizer state");
  const IValue groups_value = entry(dict, "param_groups", source + " optimizer state");
  TORCH_CHECK(groups_value.isList(), source, ": 'param_groups' must be a list, got ", groups_value.tagKind());
  const auto saved_groups = groups_value.toListRef();
  auto& groups = optimizer.param_groups();
  TORCH_CHECK(saved_groups.size() == groups.size(), source, " has ", saved_groups.size(),
              " parameter groups but this ", kind, " optimizer has ", groups.size());

  // First read and check everything, then change the optimizer: a bad file leaves it as it was.
  std::vector<std::unique_ptr<TorchOptions>> options;
  std::map<int64_t, std::pair<torch::Tensor, size_t>> by_index;  // saved number -> (parameter, group)
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string where = source + " param group " + std::to_string(g);
    const GenericDict saved = as_dict(saved_groups[g], where);
    const IValue params_value = entry(saved, "params", where);
    TORCH_CHECK(params_value.isList(), where, ": 'params' must be a list, got ", params_value.tagKind());
    const auto saved_params = params_value.toListRef();
    const auto& params = groups[g].params();
    TORCH_CHECK(saved_params.size() == params.size(), where, " has ", saved_params.size(),
                " parameters but this optimizer's group ", g, " has ", params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      TORCH_CHECK(saved_params[i].isInt(), where, ": 'params' must hold ints, got ", saved_params[i].tagKind());
      TORCH_CHECK(by_index.emplace(saved_params[i].toInt(), std::make_pair(params[i], g)).second, where,
                  " lists parameter ", saved_params[i].toInt(), " twice");
    }
    options.push_back(codec.read_group(saved, where));
  }
  std::vector<std::pair<void*, std::unique_ptr<ParamState>>> states;
  for (const auto& item : as_dict(entry(dict, "state", source + " optimizer state"), source + " 'state'")) {
    TORCH_CHECK(item.key().isInt(), source, ": 'state' keys must be parameter numbers, got ", item.key());
    const int64_t index = item.key().toInt();
    const std::string where = source + " state of parameter " + std::to_string(index);
    auto it = by_index.find(index);
    TORCH_CHECK(it != by_index.end(), where, ": no param group lists parameter ", index, " (they list ",
                by_index.size(), " parameters)");
    const auto& [param, g] = it->second;
    states.emplace_back(state_key(param), codec.read_state(as_dict(item.value(), where), param, *options[g], where));
  }

  for (size_t g = 0; g < groups.size(); ++g) groups[g].set_options(std::move(options[g]));
  optimizer.state().clear();
  for (auto& [key, state] : states) optimizer.state()[key] = std::move(state);
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  const Codec& codec = codec_for(optimizer, "optimizer_state_bytes");
  int64_t bytes = 0;
  for (const auto& item : optimizer.state())
    for (const torch::Tensor& t : codec.state_tensors(*item.second)) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

}  // namespace lockstep::optim
