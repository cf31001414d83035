// `lockstep export`: a reference model's weights -> an ONNX file, without Python.
#include <c10/util/StringUtil.h>

#include <filesystem>
#include <iostream>
#include <memory>

#include "commands.h"
#include "lockstep/export/onnx_exporter.h"
#include "lockstep/export/weights_file.h"
#include "lockstep/models/zoo.h"

namespace lockstep::cli {

namespace {

struct ExportArgs {
  std::string model = "convnet";
  std::string weights;
  std::string out;
  bool fold_bn = false;
};

int run_export(const ExportArgs& a) {
  exporting::check_output_path("--out", a.out);  // before the slow part
  auto model = models::make_model(a.model);
  const exporting::WeightsSource source = exporting::load_weights(*model, a.model, a.weights);

  auto options = exporting::ExportOptions()
                     .model_name(a.model)
                     .input_shape(models::input_shape(a.model))
                     .fold_batch_norm(a.fold_bn);
  std::vector<std::pair<std::string, std::string>> metadata{
      {"weights", std::filesystem::path(a.weights).filename().string()}, {"weights_kind", source.kind}};
  for (const auto& setting : source.run_settings) {
    metadata.push_back(setting);
    if (setting.first == "run.precision" && setting.second != "fp32")  // See the issue: half-trained -> fp32
      metadata.emplace_back("exported_precision", "fp32 (trained in " + setting.second + ")");
  }
  options.metadata(metadata);
  const onnx::ModelProto proto = exporting::export_model(*model, options);
  exporting::save_model(proto, a.out);
  std::cout << "exported " << a.model << " (" << proto.graph().node_size() << " nodes, "
            << proto.graph().initializer_size() << " initializers, opset " << exporting::kOpsetVersion
            << (a.fold_bn ? ", batch norm folded" : "") << ") from " << source.kind << " '" << a.weights << "' to '"
            << a.out << "' (" << std::filesystem::file_size(a.out) << " bytes)\n";
  return 0;
}

}  // namespace

Command add_export_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("export", "Export a reference model's weights to ONNX (opset 17, checked)");
  cmd->option_defaults()->always_capture_default();
  auto a = std::make_shared<ExportArgs>();
  const auto& models = models::model_names();
  cmd->add_option("--model", a->model, "Reference model: " + c10::Join(", ", models))->check(CLI::IsMember(models));
  cmd->add_option("--weights", a->weights,
                  "Weights: a --save-model file, a checkpoint, or Python's torch.save(model.state_dict())")
      ->required();
  cmd->add_option("--out", a->out, "The ONNX file to write (atomically, after the checker passes)")->required();
  cmd->add_flag("--fold-bn", a->fold_bn, "Fold each BatchNormalization into the Conv before it");
  return {cmd, [a] { return run_export(*a); }};
}

}  // namespace lockstep::cli
