#include "lockstep/models/zoo.h"

#include <c10/util/StringUtil.h>

#include "lockstep/models/convnet.h"
#include "lockstep/models/mlp.h"
#include "lockstep/models/resnet.h"

namespace lockstep::models {
void check_model_name(const std::string& name) {
  const auto& names = model_names();
  TORCH_CHECK_VALUE(std::find(names.begin(), names.end(), name) != names.end(), "unknown model '",
                    name, "'; choose one of: ", c10::Join(", ", names));
}

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names{"convnet", "mlp", "mlp-wide", "resnet18"};
  return names;
}

const std::vector<std::string>& text_model_names() {
  static const std::vector<std::string> names{"gpt-mini"};
  return names;
}

std::vector<int64_t> input_shape(const std::string& name) {
  check_model_name(name);
  if (name == "resnet18") return {3, 32, 32};
  return {1, 28, 28};
}

bool has_norm_layers(const std::string& name) {
  check_model_name(name);
  return name == "convnet" || name == "resnet18";
}

std::shared_ptr<Classifier> make_model(const std::string& name, int64_t num_classes, const NormLayer& norm_layer) {
  check_model_name(name);
  TORCH_CHECK_VALUE(num_classes >= 1, "num_classes=", num_classes, " must be at least 1");
  if (name == "convnet") return std::make_shared<ConvNetImpl>(num_classes, norm_layer);
  if (name == "mlp") return std::make_shared<MLPImpl>(784, 256, num_classes);
  if (name == "mlp-wide") return std::make_shared<WideMLPImpl>(num_classes);
  return std::make_shared<ResNet18Impl>(num_classes, norm_layer);
}

}  // namespace lockstep::models
