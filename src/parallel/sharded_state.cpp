#include "lockstep/parallel/sharded_state.h"

#include <torch/torch.h>

#include <map>
#include <set>
#include <sstream>

#include "lockstep/core/ivalue_dict.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/optim/state_dict.h"

namespace lockstep::parallel {
namespace {

using c10::IValue;
using GenericDict = c10::impl::GenericDict;
using TensorDict = c10::Dict<std::string, torch::Tensor>;

int64_t as_int(const IValue& v, const std::string& where) {
  TORCH_CHECK(v.isInt(), where, " must be an int, got ", v.tagKind());
  return v.toInt();
}

std::vector<int64_t> ints(const IValue& v, const std::string& where) {
  TORCH_CHECK(v.isList(), where, " must be a list of ints, got ", v.tagKind());
  std::vector<int64_t> out;
  for (const IValue& x : v.toListRef()) out.push_back(as_int(x, where));
  return out;
}

std::vector<std::string> strings(const IValue& v, const std::string& where) {
  TORCH_CHECK(v.isList(), where, " must be a list of strings, got ", v.tagKind());
  std::vector<std::string> out;
  for (const IValue& x : v.toListRef()) {
    TORCH_CHECK(x.isString(), where, " must hold strings, got ", x.tagKind());
    out.push_back(x.toStringRef());
  }
  return out;
}

c10::List<int64_t> int_list(const std::vector<int64_t>& values) {
  c10::List<int64_t> out;
  for (int64_t v : values) out.push_back(v);
  return out;
}

c10::List<std::string> string_list(const std::vector<std::string>& values) {
  c10::List<std::string> out;
  for (const auto& v : values) out.push_back(v);
  return out;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The per-parameter tensors of a padded flat buffer (N x S elements) laid out as `layout` says.
std::vector<torch::Tensor> cut(const torch::Tensor& full, const ShardLayout& layout) {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < layout.params.size(); ++i)
    out.push_back(full.narrow(0, layout.offsets[i], numel_of(layout.shapes[i])).view(layout.shapes[i]).clone());
  return out;
}

// Flat buffer k's (S) pieces from every rank, end to end: (N x S). `what` names the piece.
torch::Tensor joined(const std::vector<torch::Tensor>& pieces, const ShardLayout& layout, const std::string& what,
                     const std::string& source) {
  for (size_t r = 0; r < pieces.size(); ++r)
    TORCH_CHECK(pieces[r].dim() == 1 && pieces[r].numel() == layout.shard_numel, source, ": rank ", r, "'s ", what,
                " of unit '", layout.name, "' has shape ", pieces[r].sizes(), " but the unit's shards hold ",
                layout.shard_numel, " elements; the rank files are not from one save");
  return torch::cat(pieces);
}

// `module`'s parameters that no layout lists: the frozen ones (Note [Frozen parameters]).
torch::OrderedDict<std::string, torch::Tensor> unlisted_parameters(const torch::nn::Module& module,
                                                                   const std::vector<ShardLayout>& layouts) {
  std::set<std::string> listed;
  for (const ShardLayout& l : layouts) listed.insert(l.params.begin(), l.params.end());
  torch::OrderedDict<std::string, torch::Tensor> out;
  for (const auto& item : module.named_parameters())
    if (listed.count(item.key()) == 0) out.insert(item.key(), item.value());
  return out;
}

GenericDict optimizer_state_of(const ShardedState& s, const std::string& where) {
  return as_dict(dict_entry(as_dict(s.optimizer, where), "state", where), where + " 'state'");
}

}  // namespace

bool ShardLayout::operator==(const ShardLayout& o) const {
  return name == o.name && params == o.params && shapes == o.shapes && offsets == o.offsets &&
         indices == o.indices && shard_numel == o.shard_numel;
}

std::string ShardLayout::describe() const {
  std::ostringstream s;
  s << "'" << name << "' (" << params.size() << " parameters, " << shard_numel << " elements per rank)";
  return s.str();
}

ShardLayout shard_layout(std::string name, const FlatParameters& flat) {
  ShardLayout l;
  l.name = std::move(name);
  l.params = flat.names();
  for (const auto& p : flat.params()) l.shapes.push_back(p.sizes().vec());
  l.offsets = flat.offsets();
  l.indices = flat.indices();
  l.shard_numel = flat.shard_numel();
  return l;
}

IValue layouts_to_ivalue(const std::vector<ShardLayout>& layouts) {
  c10::impl::GenericList out(c10::DictType::create(c10::StringType::get(), c10::AnyType::get()));
  for (const ShardLayout& l : layouts) {
    GenericDict d = string_dict();
    d.insert("name", l.name);
    d.insert("params", string_list(l.params));
    c10::impl::GenericList shapes(c10::ListType::ofInts());
    for (const auto& shape : l.shapes) shapes.push_back(int_list(shape));
    d.insert("shapes", shapes);
    d.insert("offsets", int_list(l.offsets));
    d.insert("indices", int_list(l.indices));
    d.insert("shard_numel", l.shard_numel);
    out.push_back(d);
  }
  return out;
}

std::vector<ShardLayout> layouts_from_ivalue(const IValue& value, const std::string& source) {
  TORCH_CHECK(value.isList(), source, ": 'units' must be a list, got ", value.tagKind());
  std::vector<ShardLayout> out;
  int64_t next_index = 0;  // files without "indices" number the parameters consecutively
  for (const IValue& item : value.toListRef()) {
    const std::string where = source + " unit " + std::to_string(out.size());
    const GenericDict d = as_dict(item, where);
    ShardLayout l;
    const IValue name = dict_entry(d, "name", where);
    TORCH_CHECK(name.isString(), where, ": 'name' must be a string, got ", name.tagKind());
    l.name = name.toStringRef();
    l.params = strings(dict_entry(d, "params", where), where + " 'params'");
    const IValue shapes = dict_entry(d, "shapes", where);
    TORCH_CHECK(shapes.isList(), where, ": 'shapes' must be a list, got ", shapes.tagKind());
    for (const IValue& shape : shapes.toListRef()) l.shapes.push_back(ints(shape, where + " 'shapes'"));
    l.offsets = ints(dict_entry(d, "offsets", where), where + " 'offsets'");
    const auto indices = d.find("indices");
    if (indices != d.end()) {
      l.indices = ints(indices->value(), where + " 'indices'");
    } else {
      for (size_t i = 0; i < l.params.size(); ++i) l.indices.push_back(next_index + static_cast<int64_t>(i));
    }
    next_index += static_cast<int64_t>(l.params.size());
    l.shard_numel = as_int(dict_entry(d, "shard_numel", where), where + " 'shard_numel'");
    TORCH_CHECK(l.shapes.size() == l.params.size() && l.offsets.size() == l.params.size() &&
                    l.indices.size() == l.params.size() && l.shard_numel >= 0,
                where, " lists ", l.params.size(), " parameters, ", l.shapes.size(), " shapes, ", l.offsets.size(),
                " offsets and ", l.indices.size(), " indices: it is damaged");
    out.push_back(std::move(l));
  }
  return out;
}

GenericDict sharded_state_to_dict(const ShardedState& s) {
  GenericDict shards = string_dict();
  for (size_t k = 0; k < s.layouts.size(); ++k) shards.insert(s.layouts[k].name, s.shards[k]);
  GenericDict d = string_dict();
  d.insert("rank", s.rank);
  d.insert("world_size", s.world_size);
  d.insert("units", layouts_to_ivalue(s.layouts));
  d.insert("shards", shards);
  d.insert("optimizer", s.optimizer);
  d.insert("scaler", s.scaler);
  d.insert("buffers", s.buffers);
  d.insert("frozen", s.frozen);
  d.insert("model_keys", string_list(s.model_keys));
  return d;
}

ShardedState sharded_state_from_dict(const IValue& value, const std::string& source) {
  const GenericDict d = as_dict(value, source);
  ShardedState s;
  s.rank = as_int(dict_entry(d, "rank", source), source + " 'rank'");
  s.world_size = as_int(dict_entry(d, "world_size", source), source + " 'world_size'");
  s.layouts = layouts_from_ivalue(dict_entry(d, "units", source), source);
  const GenericDict shards = as_dict(dict_entry(d, "shards", source), source + " 'shards'");
  for (const ShardLayout& l : s.layouts) {
    const IValue t = dict_entry(shards, l.name, source + " 'shards'");
    TORCH_CHECK(t.isTensor(), source, ": the shard of unit '", l.name, "' is not a tensor but a ", t.tagKind());
    s.shards.push_back(t.toTensor());
  }
  s.optimizer = dict_entry(d, "optimizer", source);
  s.scaler = dict_entry(d, "scaler", source);
  for (const auto& item : as_dict(dict_entry(d, "buffers", source), source + " 'buffers'")) {
    TORCH_CHECK(item.key().isString() && item.value().isTensor(), source, ": 'buffers' must map names to tensors");
    s.buffers.insert(item.key().toStringRef(), item.value().toTensor());
  }
  const auto frozen = d.find("frozen");  // absent from files written before frozen parameters
  if (frozen != d.end()) {
    for (const auto& item : as_dict(frozen->value(), source + " 'frozen'")) {
      TORCH_CHECK(item.key().isString() && item.value().isTensor(), source, ": 'frozen' must map names to tensors");
      s.frozen.insert(item.key().toStringRef(), item.value().toTensor());
    }
  }
  s.model_keys = strings(dict_entry(d, "model_keys", source), source + " 'model_keys'");
  return s;
}

// See Note [Sharded state]: copies of what this rank holds, nothing gathered.
ShardedState make_sharded_state(const std::vector<ShardLayout>& layouts, const std::vector<torch::Tensor>& shards,
                                const torch::optim::Optimizer& shard_optimizer, const amp::GradScaler& scaler,
                                const torch::nn::Module& module, const dist::ProcessGroup& group) {
  torch::NoGradGuard no_grad;
  ShardedState s;
  s.rank = group.rank();
  s.world_size = group.size();
  s.layouts = layouts;
  // clone(): a shard may be a view of the whole flat buffer (ZeRO), which pickling would write out.
  for (const auto& shard : shards) s.shards.push_back(shard.detach().clone());
  s.optimizer = optim::optimizer_state_dict(shard_optimizer);
  s.scaler = scaler.state_dict();
  for (const auto& item : module.named_buffers()) s.buffers.insert(item.key(), item.value().detach().clone());
  for (const auto& item : unlisted_parameters(module, layouts)) s.frozen.insert(item.key(), item.value().detach().clone());
  // Keys only: an FSDP unit's parameters hold no memory between uses.
  for (const auto& item : models::state_dict(module)) s.model_keys.push_back(item.first);
  return s;
}

void load_sharded_state(const ShardedState& state, const std::vector<ShardLayout>& layouts,
                        const std::vector<torch::Tensor>& shards, torch::optim::Optimizer& shard_optimizer,
                        amp::GradScaler& scaler, torch::nn::Module& module, const dist::ProcessGroup& group,
                        const std::string& source) {
  const int64_t rank = group.rank();
  TORCH_CHECK_VALUE(state.world_size == group.size() && state.rank == rank, "rank ", rank, ": ", source,
                    " holds the shards of rank ", state.rank, " of ", state.world_size, ", not of rank ", rank, " of ",
                    group.size(), ": each rank loads its own file of a checkpoint written on as many ranks");
  TORCH_CHECK_VALUE(state.layouts.size() == layouts.size(), "rank ", rank, ": ", source, " holds ",
                    state.layouts.size(), " units but this run has ", layouts.size(),
                    "; resume with the FsdpOptions::min_params it was written with, or under another strategy");
  for (size_t k = 0; k < layouts.size(); ++k)
    TORCH_CHECK_VALUE(state.layouts[k] == layouts[k], "rank ", rank, ": ", source, "'s unit ", k, " is ",
                      state.layouts[k].describe(), " but this run's is ", layouts[k].describe(),
                      "; resume with the model and FsdpOptions::min_params it was written with, or under another strategy");
  for (size_t k = 0; k < shards.size(); ++k)
    TORCH_CHECK(state.shards[k].sizes() == shards[k].sizes(), "rank ", rank, ": ", source, "'s shard of unit '",
                layouts[k].name, "' has shape ", state.shards[k].sizes(), " but this rank's has ", shards[k].sizes());
  auto named = module.named_buffers();
  for (const auto& item : state.buffers) {
    const torch::Tensor* buffer = named.find(item.key());
    TORCH_CHECK(buffer != nullptr && buffer->sizes() == item.value().sizes(), "rank ", rank, ": ", source,
                " holds buffer '", item.key(), "' of shape ", item.value().sizes(), ", which this model ",
                buffer ? "has with shape " + c10::str(buffer->sizes()) : std::string("does not have"));
  }
  const auto frozen = unlisted_parameters(module, layouts);
  TORCH_CHECK_VALUE(state.frozen.size() == frozen.size(), "rank ", rank, ": ", source, " holds ", state.frozen.size(),
                    " frozen parameters but this model has ", frozen.size(), "; resume with the parameters frozen ",
                    "as they were when it was written, or under another strategy");
  for (const auto& item : state.frozen) {
    const torch::Tensor* p = frozen.find(item.key());
    TORCH_CHECK_VALUE(p != nullptr && p->sizes() == item.value().sizes(), "rank ", rank, ": ", source,
                      " holds frozen parameter '", item.key(), "' of shape ", item.value().sizes(), ", which this ",
                      "model ", p ? "has with shape " + c10::str(p->sizes()) : std::string("does not have frozen"));
  }
  // Checked: now change things (the optimizer checks its own state before changing anything).
  optim::load_optimizer_state_dict(shard_optimizer, state.optimizer, source);
  if (scaler.is_enabled()) scaler.load_state_dict(as_dict(state.scaler, source + " 'scaler'"));
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < shards.size(); ++k) shards[k].copy_(state.shards[k]);
  for (const auto& item : state.buffers) named.find(item.key())->copy_(item.value());
  for (const auto& item : state.frozen) frozen.find(item.key())->copy_(item.value());
}

// See Note [Sharded state]: the flat buffers are the ranks' shards end to end.
ConsolidatedState consolidate_sharded_states(const std::vector<ShardedState>& ranks, const std::string& source) {
  TORCH_CHECK(!ranks.empty(), source, " holds no rank's state");
  const int64_t world = static_cast<int64_t>(ranks.size());
  const std::vector<ShardLayout>& layouts = ranks[0].layouts;
  for (int64_t r = 0; r < world; ++r) {
    TORCH_CHECK(ranks[r].rank == r && ranks[r].world_size == world, source, ": the file of rank ", r, " holds rank ",
                ranks[r].rank, " of ", ranks[r].world_size, " (expected ", r, " of ", world, ")");
    TORCH_CHECK(ranks[r].layouts == layouts && ranks[r].shards.size() == layouts.size(), source, ": rank ", r,
                "'s units differ from rank 0's; the rank files are not from one save");
  }
  ConsolidatedState out;
  // Parameters: each flat buffer from its N shards, cut at the offsets.
  std::map<std::string, torch::Tensor> params;
  for (size_t k = 0; k < layouts.size(); ++k) {
    std::vector<torch::Tensor> pieces;
    for (const ShardedState& s : ranks) pieces.push_back(s.shards[k].to(torch::kFloat));
    const std::vector<torch::Tensor> cut_params = cut(joined(pieces, layouts[k], "parameter shard", source), layouts[k]);
    for (size_t i = 0; i < cut_params.size(); ++i) params.emplace(layouts[k].params[i], cut_params[i]);
  }
  for (const auto& item : ranks[0].frozen) params.emplace(item.key(), item.value().clone());
  for (const std::string& key : ranks[0].model_keys) {
    auto p = params.find(key);
    if (p != params.end()) {
      out.model.insert(key, p->second);
      continue;
    }
    auto b = ranks[0].buffers.find(key);
    TORCH_CHECK(b != ranks[0].buffers.end(), source, ": model entry '", key, "' is neither a sharded or frozen ",
                "parameter nor a buffer of rank 0");
    out.model.insert(key, b->value().clone());
  }

  // Optimizer state: each flat entry (a moment) joined and cut like the parameters; the rest
  // (Adam's step) is rank 0's, the same for every parameter of the shard.
  const std::string where = source + " optimizer state";
  std::vector<GenericDict> states;
  for (const ShardedState& s : ranks) states.push_back(optimizer_state_of(s, where));
  c10::Dict<int64_t, TensorDict> per_param;  // by model index: frozen parameters have no entry
  int64_t count = static_cast<int64_t>(ranks[0].frozen.size());  // the model's parameters
  for (const ShardLayout& layout : layouts) count += static_cast<int64_t>(layout.params.size());
  for (const ShardLayout& layout : layouts)
    for (int64_t index : layout.indices)
      TORCH_CHECK(index >= 0 && index < count, where, ": unit '", layout.name, "' numbers a parameter ", index,
                  " but the model has ", count, " (", ranks[0].frozen.size(), " frozen): the files are damaged");
  for (size_t k = 0; k < layouts.size(); ++k) {
    const ShardLayout& layout = layouts[k];
    const int64_t n = static_cast<int64_t>(layout.params.size());
    auto mine = states[0].find(static_cast<int64_t>(k));
    if (mine != states[0].end()) {
      std::vector<TensorDict> entries(n);
      for (const auto& item : as_dict(mine->value(), where)) {
        const std::string& key = item.key().toStringRef();
        TORCH_CHECK(item.value().isTensor(), where, " of unit '", layout.name, "': '", key, "' is not a tensor");
        const torch::Tensor t = item.value().toTensor();
        if (!(t.dim() == 1 && t.size(0) == layout.shard_numel)) {
          for (auto& e : entries) e.insert(key, t.clone());
          continue;
        }
        std::vector<torch::Tensor> pieces;
        for (int64_t r = 0; r < world; ++r) {
          auto theirs = states[r].find(static_cast<int64_t>(k));
          TORCH_CHECK(theirs != states[r].end(), where, ": rank ", r, " has no state for unit '", layout.name,
                      "' but rank 0 has; the rank files are not from one save");
          pieces.push_back(dict_entry(as_dict(theirs->value(), where), key, where + " of rank " + std::to_string(r)).toTensor());
        }
        const std::vector<torch::Tensor> cut_state = cut(joined(pieces, layout, "'" + key + "'", where), layout);
        for (int64_t i = 0; i < n; ++i) entries[i].insert(key, cut_state[i]);
      }
      for (int64_t i = 0; i < n; ++i) per_param.insert(layout.indices[i], entries[i]);
    }
  }
  const GenericDict rank0 = as_dict(ranks[0].optimizer, where);
  const IValue groups_value = dict_entry(rank0, "param_groups", where);
  TORCH_CHECK(groups_value.isList() && groups_value.toListRef().size() == 1, where,
              ": the shard optimizer must have one parameter group");
  GenericDict group = string_dict();
  for (const auto& item : as_dict(groups_value.toListRef()[0], where + " param group 0"))
    if (item.key().toStringRef() != "params") group.insert(item.key(), item.value());
  c10::List<int64_t> numbers;
  for (int64_t i = 0; i < count; ++i) numbers.push_back(i);
  group.insert("params", numbers);
  c10::impl::GenericList groups(c10::DictType::create(c10::StringType::get(), c10::AnyType::get()));
  groups.push_back(group);
  GenericDict optimizer = string_dict();
  optimizer.insert("state", per_param);
  optimizer.insert("param_groups", groups);
  out.optimizer = optimizer;
  out.scaler = ranks[0].scaler;
  return out;
}

}  // namespace lockstep::parallel
