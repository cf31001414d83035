#include "lockstep/parallel/shard_state_dict.h"

#include <torch/torch.h>

#include <map>
#include <vector>

#include "lockstep/core/ivalue_dict.h"
#include "lockstep/optim/state_dict.h"

namespace lockstep::parallel {
namespace {

using c10::IValue;
using GenericDict = c10::impl::GenericDict;
using TensorDict = c10::Dict<std::string, torch::Tensor>;

// The one param group of a shard optimizer, or of a saved state, with "params" set to `params`.
GenericDict single_group(const IValue& groups_value, c10::List<int64_t> params, const std::string& where) {
  TORCH_CHECK(groups_value.isList(), where, ": 'param_groups' must be a list, got ", groups_value.tagKind());
  const auto groups = groups_value.toListRef();
  TORCH_CHECK(groups.size() == 1, where, " has ", groups.size(),
              " parameter groups; the zero strategies shard an optimizer of one group");
  GenericDict group = string_dict();
  for (const auto& item : as_dict(groups[0], where + " param group 0"))
    if (item.key().toStringRef() != "params") group.insert(item.key(), item.value());
  group.insert("params", params);
  return group;
}

// The model's parameter count, frozen ones included (Note [Frozen parameters]).
int64_t parameter_count(const std::vector<const FlatParameters*>& flats) {
  TORCH_CHECK(!flats.empty(), "a sharded optimizer steps at least one flat buffer");
  for (const FlatParameters* flat : flats)
    TORCH_CHECK(flat->model_param_count() == flats[0]->model_param_count(), "flat buffers of one model disagree on ",
                "its parameter count: ", flat->model_param_count(), " and ", flats[0]->model_param_count());
  return flats[0]->model_param_count();
}

c10::List<int64_t> numbers(int64_t count) {
  c10::List<int64_t> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(i);
  return out;
}

// A flat state tensor (a moment) is (S) like its shard; anything else (Adam's step) is a scalar
// equal on every rank.
bool is_flat_state(const torch::Tensor& t, const FlatParameters& flat) {
  return t.dim() == 1 && t.size(0) == flat.shard_numel();
}

}  // namespace

// See Note [Consolidated optimizer state].
IValue consolidated_optimizer_state_dict(const torch::optim::Optimizer& shard_optimizer,
                                         const std::vector<const FlatParameters*>& flats, dist::ProcessGroup& group) {
  const GenericDict mine = optim::optimizer_state_dict(shard_optimizer).toGenericDict();
  const int64_t count = parameter_count(flats);
  const auto state = mine.at("state").toGenericDict();
  c10::Dict<int64_t, TensorDict> out_state;  // frozen parameters have no entry, as in a replica's
  for (size_t k = 0; k < flats.size(); ++k) {
    const FlatParameters& flat = *flats[k];
    const int64_t n = static_cast<int64_t>(flat.params().size());
    auto it = state.find(static_cast<int64_t>(k));
    if (it != state.end()) {
      std::vector<TensorDict> per_param(n);
      for (const auto& item : it->value().toGenericDict()) {
        const std::string& key = item.key().toStringRef();
        const torch::Tensor t = item.value().toTensor();
        if (!is_flat_state(t, flat)) {
          for (auto& d : per_param) d.insert(key, t.clone());
          continue;
        }
        torch::Tensor full = torch::empty({flat.padded_numel()}, t.options());
        group.all_gather_into(full, t);
        const std::vector<torch::Tensor> pieces = flat.unflatten(full);
        for (int64_t i = 0; i < n; ++i) per_param[i].insert(key, pieces[i]);
      }
      for (int64_t i = 0; i < n; ++i) out_state.insert(flat.indices()[i], per_param[i]);
    }
  }
  c10::impl::GenericList groups(c10::DictType::create(c10::StringType::get(), c10::AnyType::get()));
  groups.push_back(single_group(mine.at("param_groups"), numbers(count), "the shard optimizer's state"));
  GenericDict out = string_dict();
  out.insert("state", out_state);
  out.insert("param_groups", groups);
  return out;
}

namespace {

// The state of flat `flat`'s shard from the per-parameter dicts of its parameters.
GenericDict shard_state_entry(const FlatParameters& flat, const std::vector<GenericDict>& per_param,
                              const std::string& where) {
  GenericDict shard_entry = string_dict();
  const int64_t count = static_cast<int64_t>(per_param.size());
  for (const auto& item : per_param[0]) {
    const std::string& key = item.key().toStringRef();
    bool shaped = true;  // shaped like its parameter, for every parameter
    for (int64_t i = 0; i < count && shaped; ++i) {
      const auto it = per_param[i].find(key);
      shaped = it != per_param[i].end() && it->value().isTensor() &&
               it->value().toTensor().sizes() == flat.params()[i].sizes();
    }
    if (!shaped) {  // a scalar (Adam's step): the same for every parameter, as they all step together
      shard_entry.insert(key, item.value());
      continue;
    }
    std::vector<torch::Tensor> tensors;
    for (int64_t i = 0; i < count; ++i) {
      const IValue v = dict_entry(per_param[i], key, where + " of parameter '" + flat.names()[i] + "'");
      TORCH_CHECK(v.isTensor(), where, " of parameter '", flat.names()[i], "': '", key, "' must be a tensor, got ",
                  v.tagKind());
      tensors.push_back(v.toTensor().to(torch::kFloat));
    }
    const torch::Tensor full = flat.flatten(tensors, where + " '" + key + "'");
    shard_entry.insert(key, full.narrow(0, flat.shard_begin(flat.rank()), flat.shard_numel()).clone());
  }
  return shard_entry;
}

}  // namespace

// See Note [Consolidated optimizer state].
void load_sharded_optimizer_state_dict(torch::optim::Optimizer& shard_optimizer,
                                       const std::vector<const FlatParameters*>& flats, const IValue& value,
                                       const std::string& source) {
  const std::string where = source + " optimizer state";
  const GenericDict dict = as_dict(value, where);
  const int64_t count = parameter_count(flats);
  const GenericDict group = single_group(dict_entry(dict, "param_groups", where),
                                         numbers(static_cast<int64_t>(flats.size())), where);
  const auto listed = dict_entry(as_dict(dict_entry(dict, "param_groups", where).toListRef()[0], where), "params", where);
  TORCH_CHECK(listed.isList() && static_cast<int64_t>(listed.toListRef().size()) == count, where, " lists ",
              listed.isList() ? std::to_string(listed.toListRef().size()) : listed.tagKind(),
              " parameters but the model has ", count, " (was it saved from a different model?)");
  // The saved numbers name the parameters in order (Note [Optimizer state layout]).
  std::vector<int64_t> saved_numbers;
  for (const IValue& n : listed.toListRef()) {
    TORCH_CHECK(n.isInt(), where, ": 'params' must hold ints, got ", n.tagKind());
    saved_numbers.push_back(n.toInt());
  }
  const GenericDict saved_state = as_dict(dict_entry(dict, "state", where), where + " 'state'");

  // Frozen parameters' entries are not read: they have none in a replica's state either.
  GenericDict shard_state(c10::IntType::get(), c10::AnyType::get());
  for (size_t k = 0; k < flats.size() && !saved_state.empty(); ++k) {
    const FlatParameters& flat = *flats[k];
    std::vector<GenericDict> per_param;
    for (size_t i = 0; i < flat.params().size(); ++i) {
      const int64_t index = flat.indices()[i];
      auto it = saved_state.find(saved_numbers[index]);
      TORCH_CHECK(it != saved_state.end(), where, " has state for ", saved_state.size(), " of ", count,
                  " parameters, none for parameter ", index, " ('", flat.names()[i],
                  "'): a sharded optimizer needs all of the trainable ones or none (was a parameter unused, or ",
                  "frozen when it was saved?)");
      per_param.push_back(as_dict(it->value(), where + " of parameter " + std::to_string(index)));
    }
    shard_state.insert(static_cast<int64_t>(k), shard_state_entry(flat, per_param, where));
  }
  c10::impl::GenericList groups(c10::DictType::create(c10::StringType::get(), c10::AnyType::get()));
  groups.push_back(group);
  GenericDict shard_dict = string_dict();
  shard_dict.insert("state", shard_state);
  shard_dict.insert("param_groups", groups);
  optim::load_optimizer_state_dict(shard_optimizer, shard_dict, source);
}

GenericDict sharded_training_state_dict(const torch::optim::Optimizer& shard_optimizer,
                                        const std::vector<const FlatParameters*>& flats, dist::ProcessGroup& group,
                                        const amp::GradScaler& scaler) {
  GenericDict state = string_dict();
  state.insert("optimizer", consolidated_optimizer_state_dict(shard_optimizer, flats, group));
  state.insert("scaler", scaler.state_dict());
  return state;
}

void load_sharded_training_state_dict(torch::optim::Optimizer& shard_optimizer,
                                      const std::vector<const FlatParameters*>& flats, amp::GradScaler& scaler,
                                      const GenericDict& state, const std::string& source) {
  load_sharded_optimizer_state_dict(shard_optimizer, flats, dict_entry(state, "optimizer", source), source);
  if (scaler.is_enabled()) scaler.load_state_dict(dict_entry(state, "scaler", source).toGenericDict());
}

}  // namespace lockstep::parallel
