#include "lockstep/export/weights_file.h"

#include <torch/torch.h>

#include <sstream>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/torch_load.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/zoo.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/sharded_checkpoint.h"

namespace lockstep::exporting {
namespace {

// Whether the file holds a pickled dict with a "format" entry, which lockstep checkpoints have and
// state dicts (name -> tensor) do not. false for anything unreadable: the state-dict loader then
// reports what is wrong with the file.
bool looks_like_checkpoint(const std::string& path) {
  try {
    const c10::IValue top = torch_load(read_file(path));
    if (!top.isGenericDict()) return false;
    for (const auto& item : top.toGenericDict())
      if (item.key().isString() && item.key().toStringRef() == "format") return true;
  } catch (const std::exception&) {
  }
  return false;
}

std::string as_text(const c10::IValue& v) {
  if (v.isString()) return v.toStringRef();
  std::ostringstream s;
  s << v;
  return s.str();
}

// The reference model other than `model_name` whose state dict `dict` fits, or "".
std::string fitting_model(const c10::IValue& dict, const std::string& model_name) {
  for (const auto& name : models::model_names()) {
    if (name == model_name) continue;
    try {
      auto other = models::make_model(name);
      models::load_state_dict(*other, dict, "");
      return name;
    } catch (const c10::Error&) {
    }
  }
  return "";
}

// load_state_dict, and when the weights are another reference model's, an error that says which.
void load_into(torch::nn::Module& model, const std::string& model_name, const c10::IValue& dict,
               const std::string& source) {
  try {
    models::load_state_dict(model, dict, source);
  } catch (const c10::Error&) {
    const std::string other = fitting_model(dict, model_name);
    TORCH_CHECK(other.empty(), source, " holds the weights of a '", other, "', not of a '", model_name,
                "'; pass --model ", other);
    throw;
  }
}

}  // namespace

WeightsSource load_weights(torch::nn::Module& model, const std::string& model_name, const std::string& path) {
  WeightsSource source{path, "state_dict", {}};
  const bool sharded = train::is_sharded_checkpoint(path);  // a directory: see Note [Sharded checkpoint files]
  if (!sharded && !looks_like_checkpoint(path)) {
    const std::vector<char> bytes = read_file(path);  // a missing file: named by read_file
    c10::IValue dict;
    try {
      dict = torch_load(bytes);
    } catch (const std::exception&) {
      models::load_state_dict_file(model, path);  // throws its message for a corrupt file
    }
    load_into(model, model_name, dict, "'" + path + "'");
    return source;
  }
  source.kind = "checkpoint";
  train::Checkpoint checkpoint = train::load_checkpoint(path);
  if (checkpoint.sharded) train::reassemble_sharded_checkpoint(checkpoint);
  const auto trained = checkpoint.run.find("model");
  if (trained != checkpoint.run.end() && trained->value().isString())
    TORCH_CHECK(trained->value().toStringRef() == model_name, "'", path, "' is a checkpoint of a '",
                trained->value().toStringRef(), "', not of a '", model_name, "'; pass --model ",
                trained->value().toStringRef());
  load_into(model, model_name, checkpoint.model, "'" + path + "' (checkpoint)");
  for (const auto& item : checkpoint.run)
    source.run_settings.emplace_back("run." + item.key().toStringRef(), as_text(item.value()));
  source.run_settings.emplace_back("position.epoch", std::to_string(checkpoint.position.epoch));
  source.run_settings.emplace_back("position.step", std::to_string(checkpoint.position.step));
  return source;
}

}  // namespace lockstep::exporting
