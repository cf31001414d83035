#include "lockstep/models/state_dict.h"

#include <c10/util/string_view.h>
#include <torch/serialize.h>

#include <map>
#include <set>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/torch_load.h"
#include "lockstep/core/torch_save.h"

namespace lockstep::models {
namespace {

constexpr const char* kDdpPrefix = "module.";

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> state_dict(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false))
      out.emplace_back(prefix + p.key(), p.value());
    for (const auto& b : item.value()->named_buffers(/*recurse=*/false))
      out.emplace_back(prefix + b.key(), b.value());
  }
  return out;
}

c10::Dict<std::string, torch::Tensor> state_dict_to_dict(const torch::nn::Module& model) {
  c10::Dict<std::string, torch::Tensor> dict;  // keeps insertion order, as Python's OrderedDict
  for (auto& [key, tensor] : state_dict(model)) dict.insert(key, tensor.detach().cpu());
  return dict;
}

void save_state_dict(const torch::nn::Module& model, const std::string& path) {
  save_state_dict(state_dict_to_dict(model), path);
}

void save_state_dict(const c10::Dict<std::string, torch::Tensor>& dict, const std::string& path) {
  write_file_atomic(path, torch_save(dict));
}

void load_state_dict(torch::nn::Module& model, const c10::IValue& dict, const std::string& source) {
  TORCH_CHECK(dict.isGenericDict(), source, " is not a state dict (a dict of name -> tensor) but a ",
              dict.tagKind());
  // A whole checkpoint (lockstep's, or Python's common {"model": ..., "optimizer": ...} layout)
  // gives the state dict under its "model" or "state_dict" key.
  for (const char* key : {"model", "state_dict"}) {
    const auto& top = dict.toGenericDict();
    auto it = top.find(key);
    if (it != top.end() && it->value().isGenericDict())
      return load_state_dict(model, it->value(), source + "['" + key + "']");
  }
  std::map<std::string, torch::Tensor> given;
  bool all_prefixed = true;
  for (const auto& item : dict.toGenericDict()) {
    TORCH_CHECK(item.key().isString() && item.value().isTensor(), source,
                " is not a state dict: it has an entry that is not name -> tensor");
    const std::string key = item.key().toStringRef();
    all_prefixed = all_prefixed && c10::string_view(key).starts_with(kDdpPrefix);
    given.emplace(key, item.value().toTensor());
  }
  if (all_prefixed && !given.empty()) {  // saved from DDP's wrapper: drop "module."
    std::map<std::string, torch::Tensor> stripped;
    for (auto& [k, v] : given) stripped.emplace(k.substr(std::string(kDdpPrefix).size()), v);
    given.swap(stripped);
  }

  auto own = state_dict(model);
  std::set<std::string> own_keys;
  std::vector<std::string> missing, unexpected;
  for (const auto& [key, tensor] : own) {
    own_keys.insert(key);
    if (!given.count(key)) missing.push_back(key);
  }
  for (const auto& [key, tensor] : given)
    if (!own_keys.count(key)) unexpected.push_back(key);
  if (!missing.empty() || !unexpected.empty()) {
    std::string msg;
    for (const auto& k : missing) msg += (msg.empty() ? "" : ", ") + std::string("missing '") + k + "'";
    for (const auto& k : unexpected) msg += (msg.empty() ? "" : ", ") + std::string("unexpected '") + k + "'";
    TORCH_CHECK(false, source, " does not match the model's state dict: ", msg,
                " (was it saved from a different model?)");
  }
  torch::NoGradGuard no_grad;
  for (auto& [key, tensor] : own) {
    const torch::Tensor& src = given.at(key);
    TORCH_CHECK(src.sizes() == tensor.sizes(), source, ": '", key, "' has shape ", src.sizes(),
                " but the model's has shape ", tensor.sizes());
    // A NaN or infinite weight trains to chance accuracy without another symptom: refuse it here.
    TORCH_CHECK(!src.is_floating_point() || torch::isfinite(src).all().item<bool>(), source, ": '", key,
                "' holds ", (~torch::isfinite(src)).sum().item<int64_t>(), " non-finite values (NaN or inf) of ",
                src.numel(), "; the weights were saved from a diverged run or the file is damaged: use an earlier "
                "checkpoint");
    tensor.copy_(src);
  }
}

void load_state_dict_file(torch::nn::Module& model, const std::string& path) {
  const std::vector<char> bytes = read_file(path);  // names the path itself
  const char* fix = "; give a file written by torch.save(model.state_dict(), PATH) or by lockstep's "
                    "--save-model, or re-create it";
  c10::IValue dict;
  // A corrupt file surfaces from LibTorch's zip reader and unpickler as c10::Error or as any
  // standard exception (std::out_of_range from a vector, for one).
  try {
    dict = torch_load(bytes);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "cannot load a state dict from '", path, "': the file is corrupt or not a "
                "PyTorch file (", e.what_without_backtrace(), ")", fix);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cannot load a state dict from '", path, "': the file is corrupt or not a "
                "PyTorch file (", e.what(), ")", fix);
  }
  load_state_dict(model, dict, "'" + path + "'");
}

}  // namespace lockstep::models
