// Images for `lockstep train` (see Note [Training data]).
#include <torch/torch.h>

#include <algorithm>
#include <numeric>

#include "lockstep/core/names.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/torchscript_module.h"
#include "lockstep/models/zoo.h"
#include "reference_data.h"

namespace lockstep::train {
namespace {

// A data::Dataset split: uint8 images normalised per batch.
class ImageSplit : public TrainingData {
 public:
  explicit ImageSplit(data::Dataset split) : split_(std::move(split)) {}

  int64_t size() const override { return split_.size(); }
  Example get(int64_t index) const override {
    const Example one = get_batch({index});
    return {one.data[0], one.target[0]};
  }
  Example get_batch(const std::vector<int64_t>& indices) const override {
    auto [x, y] = split_.batch(torch::tensor(indices, torch::kInt64));  // x (B, C, H, W), y (B)
    return {x, y};
  }

 private:
  data::Dataset split_;
};

}  // namespace

ReferenceData make_image_data(const TrainOptions& o) {
  DataSplits splits = load_data(o);
  ReferenceData d;
  d.train = std::make_shared<ImageSplit>(std::move(splits.train));
  d.make_model = [&o, classes = splits.train.num_classes, train = d.train](dist::ProcessGroup* group,
                                                                            bool initial_weights) {
    std::shared_ptr<models::Classifier> model;
    if (o.model_file().empty()) {
      model = models::make_model(o.model(), classes, o.norm_layer(group));
    } else {
      auto script = std::make_shared<models::TorchScriptModuleImpl>(o.model_file());
      if (initial_weights) {  // the shapes fit, once: before anything trains or is written
        std::vector<int64_t> first(std::min(o.trainer().batch_size(), train->size()));
        std::iota(first.begin(), first.end(), 0);
        script->check_input(train->get_batch(first).data, classes,
                            "--data " + enum_name(data_source_names(), o.data()));
      }
      model = script;
    }
    if (initial_weights && !o.init_weights().empty()) models::load_state_dict_file(*model, o.init_weights());
    return model;
  };
  d.test = std::make_shared<ImageSplit>(std::move(splits.test));
  d.loss = [](const torch::Tensor& output, const torch::Tensor& target) {
    return torch::nn::functional::cross_entropy(output, target);
  };
  return d;
}

}  // namespace lockstep::train
