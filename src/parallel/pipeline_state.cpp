#include "lockstep/parallel/pipeline_state.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>

namespace lockstep::parallel {
namespace {

using c10::IValue;
using GenericDict = c10::impl::GenericDict;

constexpr int64_t kSizeTag = 1 << 20;  // above any pipeline transfer's tag
constexpr int64_t kBytesTag = kSizeTag + 1;

GenericDict string_dict() { return GenericDict(c10::StringType::get(), c10::AnyType::get()); }

GenericDict only_group(const IValue& state, const std::string& source) {
  TORCH_CHECK(state.isGenericDict(), source, ": the optimizer state is not a dict");
  const GenericDict d = state.toGenericDict();
  TORCH_CHECK(d.contains("param_groups") && d.contains("state"), source,
              ": the optimizer state has no 'state' or 'param_groups'");
  const auto groups = d.at("param_groups").toList();
  TORCH_CHECK(groups.size() == 1, source, ": the optimizer state has ", groups.size(),
              " param groups; the pipeline strategy reads states of one group");
  return groups.get(0).toGenericDict();
}

// `group` (a param group dict) with "params" replaced by 0 .. count-1.
GenericDict renumbered_group(const GenericDict& group, int64_t count) {
  GenericDict g = group.copy();
  c10::List<int64_t> params;
  for (int64_t i = 0; i < count; ++i) params.push_back(i);
  g.insert_or_assign("params", params);
  return g;
}

IValue state_dict_of(GenericDict state, const GenericDict& group) {
  GenericDict out = string_dict();
  out.insert("state", std::move(state));
  c10::impl::GenericList groups(c10::DictType::create(c10::StringType::get(), c10::AnyType::get()));
  groups.push_back(group);
  out.insert("param_groups", std::move(groups));
  return out;
}

}  // namespace

IValue gather_optimizer_state(const IValue& stage_state, int64_t first_param, int64_t owned, int64_t total_params,
                              int64_t stages, dist::ProcessGroup* group) {
  struct Part {
    int64_t first, owned;  // the stage's first owned parameter's model index, how many it owns
    IValue state;
  };
  std::vector<Part> parts{{first_param, owned, stage_state}};
  if (group && stages > 1) {
    if (group->rank() >= stages) return stage_state;
    if (group->rank() != 0) {
      GenericDict wrapped = string_dict();
      wrapped.insert("first_param", first_param);
      wrapped.insert("owned", owned);
      wrapped.insert("state", stage_state);
      const std::vector<char> pickled = torch::pickle_save(wrapped);
      torch::Tensor size = torch::tensor({static_cast<int64_t>(pickled.size())}, torch::kInt64);
      torch::Tensor payload = torch::from_blob(const_cast<char*>(pickled.data()), {static_cast<int64_t>(pickled.size())},
                                               torch::kUInt8);
      group->wait(group->send_async(size, 0, kSizeTag), "sending the optimizer state's size to rank 0");
      group->wait(group->send_async(payload, 0, kBytesTag), "sending the optimizer state to rank 0");
      return stage_state;
    }
    for (int64_t r = 1; r < stages; ++r) {
      torch::Tensor size = torch::empty({1}, torch::kInt64);
      group->recv(size, r, kSizeTag, "the size of a stage's optimizer state");
      torch::Tensor payload = torch::empty({size.item<int64_t>()}, torch::kUInt8);
      group->recv(payload, r, kBytesTag, "a stage's optimizer state");
      const std::vector<char> pickled(static_cast<const char*>(payload.data_ptr()),
                                      static_cast<const char*>(payload.data_ptr()) + payload.numel());
      const GenericDict wrapped = torch::pickle_load(pickled).toGenericDict();
      parts.push_back({wrapped.at("first_param").toInt(), wrapped.at("owned").toInt(), wrapped.at("state")});
    }
  }
  GenericDict state(c10::IntType::get(), c10::AnyType::get());
  for (const Part& part : parts) {
    only_group(part.state, "a pipeline stage");
    for (const auto& entry : part.state.toGenericDict().at("state").toGenericDict())
      if (entry.key().toInt() < part.owned) state.insert(part.first + entry.key().toInt(), entry.value());
  }
  return state_dict_of(std::move(state), renumbered_group(only_group(stage_state, "this stage"), total_params));
}

IValue slice_optimizer_state(const IValue& state, const std::vector<int64_t>& model_indices, const std::string& source) {
  const GenericDict group = only_group(state, source);
  const auto numbers = group.at("params").toList();
  const int64_t count = static_cast<int64_t>(model_indices.size());
  const int64_t highest = count > 0 ? *std::max_element(model_indices.begin(), model_indices.end()) : -1;
  TORCH_CHECK(highest < static_cast<int64_t>(numbers.size()), source, ": the optimizer state covers ", numbers.size(),
              " parameters, but this pipeline stage trains the model's parameter ", highest,
              ": was it written for another model?");
  const GenericDict all = state.toGenericDict().at("state").toGenericDict();
  GenericDict mine(c10::IntType::get(), c10::AnyType::get());
  for (int64_t j = 0; j < count; ++j) {
    const IValue key = numbers.get(model_indices[j]);
    auto it = all.find(key);
    if (it != all.end()) mine.insert(j, it->value());
  }
  return state_dict_of(std::move(mine), renumbered_group(group, count));
}

}  // namespace lockstep::parallel
