#include "lockstep/parallel/shard_state_dict.h"

#include <torch/torch.h>

#include <map>
#include <vector>

#include "lockstep/optim/state_dict.h"

namespace lockstep::parallel {
namespace {

using c10::IValue;
using GenericDict = c10::impl::GenericDict;
using TensorDict = c10::Dict<std::string, torch::Tensor>;

GenericDict string_dict() { return GenericDict(c10::StringType::get(), c10::AnyType::get()); }

IValue entry(const GenericDict& dict, const std::string& key, const std::string& where) {
  auto it = dict.find(key);
  TORCH_CHECK(it != dict.end(), where, " has no '", key, "' entry");
  return it->value();
}

GenericDict as_dict(const IValue& v, const std::string& where) {
  TORCH_CHECK(v.isGenericDict(), where, " is not a dict but a ", v.tagKind());
  return v.toGenericDict();
}

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

}  // namespace

// See Note [Consolidated optimizer state].
IValue consolidated_optimizer_state_dict(const torch::optim::Optimizer& shard_optimizer, const FlatParameters& flat,
                                         dist::ProcessGroup& group) {
  const GenericDict mine = optim::optimizer_state_dict(shard_optimizer).toGenericDict();
  const int64_t count = static_cast<int64_t>(flat.params().size());
  c10::List<int64_t> params;
  for (int64_t i = 0; i < count; ++i) params.push_back(i);

  std::vector<TensorDict> per_param(count);
  const auto state = mine.at("state").toGenericDict();
  if (!state.empty()) {
    for (const auto& item : state.begin()->value().toGenericDict()) {
      const std::string& key = item.key().toStringRef();
      const torch::Tensor t = item.value().toTensor();
      if (t.sizes() != flat.shard().sizes()) {  // a scalar such as Adam's step: equal on every rank
        for (auto& d : per_param) d.insert(key, t.clone());
        continue;
      }
      torch::Tensor full = torch::empty({flat.padded_numel()}, t.options());
      group.all_gather_into(full, t);
      const std::vector<torch::Tensor> pieces = flat.unflatten(full);
      for (int64_t i = 0; i < count; ++i) per_param[i].insert(key, pieces[i]);
    }
  }
  c10::Dict<int64_t, TensorDict> out_state;
  for (int64_t i = 0; i < count && !state.empty(); ++i) out_state.insert(i, per_param[i]);
  c10::impl::GenericList groups(c10::DictType::create(c10::StringType::get(), c10::AnyType::get()));
  groups.push_back(single_group(mine.at("param_groups"), params, "the shard optimizer's state"));
  GenericDict out = string_dict();
  out.insert("state", out_state);
  out.insert("param_groups", groups);
  return out;
}

// See Note [Consolidated optimizer state].
void load_sharded_optimizer_state_dict(torch::optim::Optimizer& shard_optimizer, const FlatParameters& flat,
                                       const IValue& value, const std::string& source) {
  const std::string where = source + " optimizer state";
  const GenericDict dict = as_dict(value, where);
  const int64_t count = static_cast<int64_t>(flat.params().size());
  const GenericDict group = single_group(entry(dict, "param_groups", where), c10::List<int64_t>({0}), where);
  const auto listed = entry(as_dict(entry(dict, "param_groups", where).toListRef()[0], where), "params", where);
  TORCH_CHECK(listed.isList() && static_cast<int64_t>(listed.toListRef().size()) == count, where, " lists ",
              listed.isList() ? std::to_string(listed.toListRef().size()) : listed.tagKind(),
              " parameters but the model has ", count, " (was it saved from a different model?)");
  // The saved numbers name the parameters in order (Note [Optimizer state layout]).
  std::vector<int64_t> numbers;
  for (const IValue& n : listed.toListRef()) {
    TORCH_CHECK(n.isInt(), where, ": 'params' must hold ints, got ", n.tagKind());
    numbers.push_back(n.toInt());
  }
  const GenericDict saved_state = as_dict(entry(dict, "state", where), where + " 'state'");

  GenericDict shard_entry = string_dict();
  if (!saved_state.empty()) {
    std::vector<GenericDict> per_param;
    for (int64_t i = 0; i < count; ++i) {
      auto it = saved_state.find(numbers[i]);
      TORCH_CHECK(it != saved_state.end(), where, " has state for ", saved_state.size(), " of ", count,
                  " parameters, none for parameter ", i, " ('", flat.names()[i],
                  "'): a sharded optimizer needs all or none (was a parameter unused?)");
      per_param.push_back(as_dict(it->value(), where + " of parameter " + std::to_string(i)));
    }
    for (const auto& item : per_param[0]) {
      const std::string& key = item.key().toStringRef();
      const IValue& first = item.value();
      bool shaped = true;  // shaped like its parameter, for every parameter
      for (int64_t i = 0; i < count && shaped; ++i) {
        const auto it = per_param[i].find(key);
        shaped = it != per_param[i].end() && it->value().isTensor() &&
                 it->value().toTensor().sizes() == flat.params()[i].sizes();
      }
      if (!shaped) {  // a scalar (Adam's step): the same for every parameter, as they all step together
        shard_entry.insert(key, first);
        continue;
      }
      std::vector<torch::Tensor> tensors;
      for (int64_t i = 0; i < count; ++i) {
        const IValue v = entry(per_param[i], key, where + " of parameter " + std::to_string(i));
        TORCH_CHECK(v.isTensor(), where, " of parameter ", i, ": '", key, "' must be a tensor, got ", v.tagKind());
        tensors.push_back(v.toTensor().to(torch::kFloat));
      }
      const torch::Tensor full = flat.flatten(tensors, where + " '" + key + "'");
      shard_entry.insert(key, full.narrow(0, flat.shard_begin(flat.rank()), flat.shard_numel()).clone());
    }
  }
  GenericDict shard_state(c10::IntType::get(), c10::AnyType::get());
  if (!saved_state.empty()) shard_state.insert(0, shard_entry);
  c10::impl::GenericList groups(c10::DictType::create(c10::StringType::get(), c10::AnyType::get()));
  groups.push_back(group);
  GenericDict shard_dict = string_dict();
  shard_dict.insert("state", shard_state);
  shard_dict.insert("param_groups", groups);
  optim::load_optimizer_state_dict(shard_optimizer, shard_dict, source);
}

}  // namespace lockstep::parallel
