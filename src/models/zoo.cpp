#include "lockstep/models/zoo.h"

#include <c10/util/StringUtil.h>

#include <functional>

#include "lockstep/models/convnet.h"
#include "lockstep/models/mlp.h"
#include "lockstep/models/resnet.h"

namespace lockstep::models {
namespace {

// One reference model: its name, the (C, H, W) images it takes, whether it has norm layers (built
// by a NormLayer), and how to build it for `num_classes`.
struct ZooEntry {
  std::string name;
  std::vector<int64_t> input_shape;
  bool norm_layers;
  std::function<std::shared_ptr<Classifier>(int64_t num_classes, const NormLayer& norm_layer)> make;
};

// The zoo: a new reference model is a header/source pair and one line here.
const std::vector<ZooEntry>& zoo() {
  static const std::vector<ZooEntry> entries{
      {"convnet", {1, 28, 28}, true,
       [](int64_t classes, const NormLayer& norm) { return std::make_shared<ConvNetImpl>(classes, norm); }},
      {"mlp", {1, 28, 28}, false,
       [](int64_t classes, const NormLayer&) { return std::make_shared<MLPImpl>(784, 256, classes); }},
      {"mlp-wide", {1, 28, 28}, false,
       [](int64_t classes, const NormLayer&) { return std::make_shared<WideMLPImpl>(classes); }},
      {"resnet18", {3, 32, 32}, true,
       [](int64_t classes, const NormLayer& norm) { return std::make_shared<ResNet18Impl>(classes, norm); }},
  };
  return entries;
}

// The entry called `name`; throws c10::ValueError naming it and the known names.
const ZooEntry& zoo_entry(const std::string& name) {
  for (const ZooEntry& e : zoo())
    if (e.name == name) return e;
  TORCH_CHECK_VALUE(false, "unknown model '", name, "'; choose one of: ", c10::Join(", ", model_names()));
}

}  // namespace

void check_model_name(const std::string& name) { zoo_entry(name); }

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const ZooEntry& e : zoo()) out.push_back(e.name);
    return out;
  }();
  return names;
}

const std::vector<std::string>& text_model_names() {
  static const std::vector<std::string> names{"gpt-mini"};
  return names;
}

std::vector<int64_t> input_shape(const std::string& name) { return zoo_entry(name).input_shape; }

bool has_norm_layers(const std::string& name) { return zoo_entry(name).norm_layers; }

std::shared_ptr<Classifier> make_model(const std::string& name, int64_t num_classes, const NormLayer& norm_layer) {
  const ZooEntry& e = zoo_entry(name);
  TORCH_CHECK_VALUE(num_classes >= 1, "num_classes=", num_classes, " must be at least 1");
  return e.make(num_classes, norm_layer);
}

}  // namespace lockstep::models
