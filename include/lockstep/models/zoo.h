#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lockstep/models/classifier.h"
#include "lockstep/models/norm_layer.h"

namespace lockstep::models {

// The reference models by name: "convnet", "mlp", "mlp-wide", "resnet18".
const std::vector<std::string>& model_names();

// The text models: "gpt-mini" (gpt_mini.h), sized by a tokenizer, so built by `lockstep train`'s
// text data (src/train/text_data.cpp) rather than make_model.
const std::vector<std::string>& text_model_names();

// Throws c10::ValueError naming `name` and the known names when it is not a reference model.
void check_model_name(const std::string& name);

// The (C, H, W) input shape a reference model expects.
std::vector<int64_t> input_shape(const std::string& name);

// Whether the model has normalisation layers, built through its NormLayer: convnet and resnet18.
bool has_norm_layers(const std::string& name);

// A freshly initialised reference model (initialisation follows torch.manual_seed), its norm
// layers built by `norm_layer` (see Note [Norm layer factory]; the MLPs have none).
// Throws c10::ValueError naming the model and the known names for an unknown name.
std::shared_ptr<Classifier> make_model(const std::string& name, int64_t num_classes = 10,
                                       const NormLayer& norm_layer = batch_norm_2d);

}  // namespace lockstep::models
