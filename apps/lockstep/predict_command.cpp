// `lockstep predict`: a trained reference model, or a TorchScript module saved in Python, on a data
// split or on image files: accuracy, the confusion matrix, latency percentiles and throughput, in
// fp32 or bf16.
#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <iostream>
#include <memory>

#include "checks.h"
#include "commands.h"
#include "lockstep/core/names.h"
#include "lockstep/core/process.h"
#include "lockstep/export/image_files.h"
#include "lockstep/export/prediction_report.h"
#include "lockstep/export/weights_file.h"
#include "lockstep/infer/predictor.h"
#include "lockstep/models/torchscript_module.h"
#include "lockstep/models/zoo.h"
#include "lockstep/train/options.h"

namespace lockstep::cli {

namespace {

struct PredictArgs {
  std::string model = "convnet";
  std::string weights;
  std::string model_file;
  std::string data = "fashion-mnist";
  std::string data_dir = data::kDefaultFashionMnistDir;
  std::string split = "test";
  int64_t limit = 0;
  std::string images, labels;
  int64_t batch_size = 64;
  int64_t warmup = 2;
  std::string precision = "fp32";
  int64_t threads = 0;
  bool json = false;
};

data::Dataset load_dataset(const PredictArgs& a) {
  auto o = train::TrainOptions().model(a.model).data_dir(a.data_dir).data(
      enum_from_name<train::DataSource>(train::data_source_names(), a.data, "--data"));
  if (a.images.empty()) {
    const train::DataSplits splits = train::load_data(o);
    return (a.split == "train" ? splits.train : splits.test).take(a.limit);
  }
  // Files: normalised as the --data source is (the training data's statistics). A --model-file
  // takes them as the default --model does: Fashion-MNIST's (1, 28, 28).
  const data::Dataset reference = o.data() == train::DataSource::kSynthetic
                                      ? data::make_synthetic(data::SyntheticOptions().size(1))
                                      : data::load_fashion_mnist(a.data_dir, data::Split::kTest);
  return exporting::load_image_files(a.images, a.labels, models::input_shape(a.model), reference.mean,
                                     reference.stddev, reference.num_classes)
      .take(a.limit);
}

// What predicts: --model with --weights, or the TorchScript --model-file.
struct LoadedModel {
  torch::nn::AnyModule module;
  std::string name;  // the reference model's, or "TorchScript"
  std::string file;
  std::string kind;  // "state_dict", "checkpoint" or "torchscript"
};

LoadedModel load_model(const PredictArgs& a) {
  TORCH_CHECK_VALUE(a.weights.empty() != a.model_file.empty(), "give --weights (for --model ", a.model,
                    ") or --model-file (a TorchScript module), one of them");
  if (!a.model_file.empty())
    return {torch::nn::AnyModule(models::TorchScriptModule(a.model_file)), "TorchScript", a.model_file, "torchscript"};
  auto model = models::make_model(a.model);
  const exporting::WeightsSource source = exporting::load_weights(*model, a.model, a.weights);
  return {torch::nn::AnyModule(model), a.model, a.weights, source.kind};
}

int run_predict(const PredictArgs& a) {
  TORCH_CHECK_VALUE(a.labels.empty() || !a.images.empty(), "--labels '", a.labels, "' needs --images");
  torch::set_num_threads(a.threads > 0 ? static_cast<int>(a.threads) : default_intra_op_threads());
  const LoadedModel model = load_model(a);
  const data::Dataset dataset = load_dataset(a);
  auto options = infer::PredictorOptions().batch_size(a.batch_size);
  if (a.precision == "bf16") options.autocast(torch::kBFloat16);
  infer::Predictor predictor(model.module, options);
  const auto report = exporting::predict(
      predictor, dataset, exporting::PredictOptions()
                                      .batch_size(a.batch_size)
                                      .warmup(a.warmup)
                                      .labelled(a.images.empty() || !a.labels.empty())
                                      .model("'" + model.file + "'"));
  if (a.json) {
    nlohmann::json j = report.to_json();
    j["model"] = model.name;
    j[a.model_file.empty() ? "weights" : "model_file"] = model.file;
    j["weights_kind"] = model.kind;
    j["precision"] = a.precision;
    j["threads"] = torch::get_num_threads();
    std::cout << j.dump() << std::endl;
  } else {
    std::cout << model.name << " from " << model.kind << " '" << model.file << "', " << a.precision << ", "
              << torch::get_num_threads() << " thread(s), " << report.samples << " samples\n"
              << report.to_text();
  }
  return 0;
}

}  // namespace

Command add_predict_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "predict", "Run a trained model on a data split or image files: accuracy, confusion matrix, latency");
  cmd->option_defaults()->always_capture_default();
  auto a = std::make_shared<PredictArgs>();
  const auto& models = models::model_names();
  auto* model = cmd->add_option("--model", a->model, "Reference model: " + c10::Join(", ", models))
                    ->check(CLI::IsMember(models));
  auto* weights = cmd->add_option("--weights", a->weights,
                                  "Weights of --model: a --save-model file, a checkpoint, or torch.save(model.state_dict())");
  cmd->add_option("--model-file", a->model_file,
                  "Instead of --model and --weights: a TorchScript module (torch.jit.save) taking the images, "
                  "(B, 1, 28, 28), and returning logits (B, classes)")
      ->excludes(weights)
      ->excludes(model);
  // Image data only: predict runs the image models (the text sources evaluated Fashion-MNIST).
  cmd->add_option("--data", a->data, "Dataset (synthetic: seeded random images)")
      ->check(CLI::IsMember({"fashion-mnist", "synthetic"}));
  cmd->add_option("--data-dir", a->data_dir, "Directory with the Fashion-MNIST IDX files");
  cmd->add_option("--split", a->split, "Which split of --data")->check(CLI::IsMember({"test", "train"}));
  cmd->add_option("--images", a->images, "Predict on this file instead: IDX (gzipped or not) or raw uint8 pixels");
  cmd->add_option("--labels", a->labels, "Labels of --images: IDX or raw uint8 (without: no accuracy)");
  cmd->add_option("--limit", a->limit, "Only the first N samples (0: all)")->check(cli::non_negative_count());
  cmd->add_option("--batch-size", a->batch_size, "Samples per forward (the batch latency is measured at)")
      ->check(cli::positive_count());
  cmd->add_option("--warmup", a->warmup, "Batches left out of the timings")->check(cli::non_negative_count());
  cmd->add_option("--precision", a->precision, "fp32, or bf16 (autocast)")->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--threads", a->threads, "Intra-op threads (0: automatic)")->check(cli::non_negative_count());
  cmd->add_flag("--json", a->json, "Print one JSON object instead of the text report");
  return {cmd, [a] { return run_predict(*a); }};
}

}  // namespace lockstep::cli
