// Images and tables for `lockstep train` (see Note [Training data]): Fashion-MNIST and synthetic
// images held in memory, an image folder read as it trains, a CSV file.
#include <torch/torch.h>

#include <algorithm>
#include <numeric>

#include "lockstep/core/names.h"
#include "lockstep/core/report.h"
#include "lockstep/data/csv.h"
#include "lockstep/data/image_folder.h"
#include "lockstep/models/mlp.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/torchscript_module.h"
#include "lockstep/models/zoo.h"
#include "lockstep/train/image_folder_data.h"
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

std::string data_name(const TrainOptions& o) { return "--data " + enum_name(data_source_names(), o.data()); }

// The first batch of `train`: what a model's input is checked against before anything trains.
Example first_batch(const TrainOptions& o, const TrainingData& train) {
  std::vector<int64_t> first(std::min(o.trainer().batch_size(), train.size()));
  std::iota(first.begin(), first.end(), 0);
  return train.get_batch(first);
}

// --model-file, or `make_reference` (a --model sized for the data): freshly initialised, with
// --init-weights loaded when `initial_weights` says so. A script's input is checked against the
// first training batch once, before anything trains or is written.
ModelFactory classifier_factory(const TrainOptions& o, int64_t classes, std::shared_ptr<TrainingData> train,
                                std::function<std::shared_ptr<models::Classifier>(dist::ProcessGroup*)> make_reference) {
  return [&o, classes, train, make_reference](dist::ProcessGroup* group, bool initial_weights) {
    std::shared_ptr<models::Classifier> model;
    if (o.model_file().empty()) {
      model = make_reference(group);
    } else {
      auto script = std::make_shared<models::TorchScriptModuleImpl>(o.model_file());
      if (initial_weights) script->check_input(first_batch(o, *train).data, classes, data_name(o));
      model = script;
    }
    if (initial_weights && !o.init_weights().empty()) models::load_state_dict_file(*model, o.init_weights());
    return model;
  };
}

parallel::LossFunction cross_entropy() {
  return [](const torch::Tensor& output, const torch::Tensor& target) {
    return torch::nn::functional::cross_entropy(output, target);
  };
}

// The directories a folder's walk skipped, said once (see Note [Walking an image folder]).
void report_repeated_directories(const data::ImageFolder& folder, const Reporter& reporter) {
  const std::vector<std::string>& repeated = folder.repeated_directories();
  if (repeated.empty()) return;
  report(reporter, ReportKind::kWarning,
         c10::str("image folder '", folder.root(), "': ", repeated.size(),
                  " directories reached again through symbolic links were skipped (each directory is read once), "
                  "e.g. '", repeated.front(), "'"));
}

ReferenceData make_image_folder_data(const TrainOptions& o) {
  auto folder = std::make_shared<const data::ImageFolder>(o.data_dir());
  report_repeated_directories(*folder, o.trainer().reporter());
  const std::vector<int64_t> undecodable = folder->undecodable();
  TORCH_CHECK_VALUE(undecodable.empty() || o.skip_bad_samples(), "image folder '", o.data_dir(), "' holds ",
                    undecodable.size(), " images lockstep cannot decode (it reads JPEG and PNG), e.g. '",
                    undecodable.empty() ? "" : folder->path(undecodable.front()),
                    "'; convert them, or pass --skip-bad-samples to leave them out");
  const auto train_transforms = data::Transforms::parse(o.transform().empty() ? "ToTensor()" : o.transform());
  const auto eval_transforms = o.val_transform().empty() ? train_transforms.for_evaluation()
                                                         : data::Transforms::parse(o.val_transform());
  const auto options = [&](const data::Transforms& t) {
    return ImageFolderDataOptions().transforms(t).skip_bad_samples(o.skip_bad_samples()).reporter(o.trainer().reporter());
  };
  std::vector<int64_t> train_indices;
  ReferenceData d;
  if (o.val_split() > 0.0) {
    auto [train, held_out] = holdout_split(folder->size(), o.val_split(), o.trainer().seed());
    train_indices = std::move(train);
    d.test = std::make_shared<ImageFolderData>(folder, options(eval_transforms), std::move(held_out));
  } else if (!o.val_dir().empty()) {
    auto val = std::make_shared<const data::ImageFolder>(o.val_dir());
    report_repeated_directories(*val, o.trainer().reporter());
    TORCH_CHECK_VALUE(val->classes() == folder->classes(), "--val-dir '", o.val_dir(), "' has the classes [",
                      c10::Join(", ", val->classes()), "] but --data-dir '", o.data_dir(), "' has [",
                      c10::Join(", ", folder->classes()), "]; both need the same class sub-directories");
    d.test = std::make_shared<ImageFolderData>(val, options(eval_transforms));
  }
  if (o.limit() > 0 && o.limit() < folder->size()) {
    if (train_indices.empty()) {
      train_indices.resize(o.limit());
      std::iota(train_indices.begin(), train_indices.end(), 0);
    } else {
      train_indices.resize(std::min<size_t>(train_indices.size(), o.limit()));
    }
  }
  d.train = std::make_shared<ImageFolderData>(folder, options(train_transforms), std::move(train_indices));
  const auto classes = static_cast<int64_t>(folder->classes().size());
  if (o.model_file().empty()) {
    // The transforms decide the shape: check it against the model's before any rank trains.
    const auto have = first_batch(o, *d.train).data.sizes().slice(1);
    const auto want = models::input_shape(o.model());
    TORCH_CHECK_VALUE(have.equals(want), "model '", o.model(), "' takes images of shape ", c10::IntArrayRef(want),
                      " but --transform '", train_transforms.str(), "' makes the images of '", o.data_dir(),
                      "' shape ", have, "; end the transforms at that size",
                      want[0] == 1 ? " with Grayscale() among them" : "", ", e.g. Resize(", want[1], "), CenterCrop(",
                      want[1], ")");
  }
  d.make_model = classifier_factory(o, classes, d.train, [&o, classes](dist::ProcessGroup* group) {
    return models::make_model(o.model(), classes, o.norm_layer(group));
  });
  d.loss = cross_entropy();
  d.run_settings.emplace_back("transform", train_transforms.str());
  return d;
}

ReferenceData make_csv_data(const TrainOptions& o) {
  TORCH_CHECK_VALUE(!o.model_file().empty() || o.model() == "mlp", "--data csv trains --model mlp (sized to the ",
                    "file's columns) or a --model-file; model '", o.model(), "' takes images");
  data::CsvTable table = data::read_csv(o.data_file(), o.label_column());
  const auto features = table.features.size(1);
  const auto classes = static_cast<int64_t>(table.classes.size());
  TORCH_CHECK_VALUE(classes >= 2, "CSV file '", o.data_file(), "': column '", o.label_column(), "' holds one class (",
                    table.classes.front(), "); a classifier needs at least two");
  ReferenceData d;
  if (o.val_split() > 0.0) {
    auto [train, held_out] = holdout_split(table.labels.size(0), o.val_split(), o.trainer().seed());
    const auto rows = [](const std::vector<int64_t>& i) { return torch::tensor(i, torch::kInt64); };
    d.test = std::make_shared<TensorData>(table.features.index_select(0, rows(held_out)),
                                          table.labels.index_select(0, rows(held_out)));
    table.features = table.features.index_select(0, rows(train));
    table.labels = table.labels.index_select(0, rows(train));
  }
  if (o.limit() > 0 && o.limit() < table.labels.size(0)) {
    table.features = table.features.narrow(0, 0, o.limit());
    table.labels = table.labels.narrow(0, 0, o.limit());
  }
  d.train = std::make_shared<TensorData>(table.features, table.labels);
  d.make_model = classifier_factory(o, classes, d.train, [features, classes](dist::ProcessGroup*) {
    return std::make_shared<models::MLPImpl>(features, 256, classes);
  });
  d.loss = cross_entropy();
  return d;
}

}  // namespace

ReferenceData make_image_data(const TrainOptions& o) {
  if (o.data() == DataSource::kImageFolder) return make_image_folder_data(o);
  if (o.data() == DataSource::kCsv) return make_csv_data(o);
  DataSplits splits = load_data(o);
  ReferenceData d;
  d.train = std::make_shared<ImageSplit>(std::move(splits.train));
  const int64_t classes = splits.train.num_classes;
  d.make_model = classifier_factory(o, classes, d.train, [&o, classes](dist::ProcessGroup* group) {
    return models::make_model(o.model(), classes, o.norm_layer(group));
  });
  d.test = std::make_shared<ImageSplit>(std::move(splits.test));
  d.loss = cross_entropy();
  return d;
}

}  // namespace lockstep::train
