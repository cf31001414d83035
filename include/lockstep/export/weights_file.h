#pragma once

#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

namespace lockstep::exporting {

// Where a model's weights came from, for the exported file's metadata and predict's report.
struct WeightsSource {
  std::string path;
  std::string kind;  // "state_dict" (--save-model, torch.save(model.state_dict())) or "checkpoint"
  // From a checkpoint: its training run's settings ("run.model", "run.precision", "run.world_size",
  // ...) and position ("position.step", "position.epoch"), as text. Empty for a state dict.
  std::vector<std::pair<std::string, std::string>> run_settings;
};

// Loads the weights in `path` into `model`, a fresh reference model `model_name`: a state dict file
// (lockstep's --save-model or Python's torch.save(model.state_dict())) or a lockstep checkpoint of
// any strategy (read and verified by train::load_checkpoint; a sharded checkpoint's directory is
// put back together from its rank files). Throws
// c10::Error naming the path: missing, unreadable or corrupt; a checkpoint of another model; or
// weights that do not fit `model_name` (naming the reference model they do fit, if one does).
WeightsSource load_weights(torch::nn::Module& model, const std::string& model_name, const std::string& path);

}  // namespace lockstep::exporting
