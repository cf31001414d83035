// The independent check of `lockstep export`: each reference model, exported by the CLI, runs in
// ONNX Runtime (onnxruntime-node, a different implementation of every operator) at batch 1 and 37
// and must give LibTorch's logits within 1e-4; Python's onnx checker (full check) must pass too.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <iomanip>
#include <iostream>

#include "lockstep/models/state_dict.h"
#include "lockstep/models/zoo.h"
#include "onnx_check.h"

namespace lockstep {
namespace {

const std::string kCli = LOCKSTEP_CLI;
constexpr double kTolerance = 1e-4;  // the bound on |ONNX Runtime - LibTorch|

// Gives every batch norm non-trivial running statistics and affine weights (fresh ones are the
// identity, which would hide a wrongly exported or folded BatchNormalization).
void randomize_batch_norms(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (const auto& m : model.modules()) {
    if (auto* bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(m.get())) {
      bn->running_mean.normal_(0.0, 0.2);
      bn->running_var.uniform_(0.5, 1.5);
      bn->weight.uniform_(0.5, 1.5);
      bn->bias.normal_(0.0, 0.2);
    }
  }
}

struct Case {
  std::string model;
  bool fold_bn;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.model << (c.fold_bn ? " --fold-bn" : ""); }

class ExportOnnxRuntime : public ::testing::TestWithParam<Case> {};

TEST_P(ExportOnnxRuntime, MatchesLibTorchAtBatchOneAndThirtySeven) {
  const std::string missing = testing::onnxruntime_missing();
  if (!missing.empty()) GTEST_SKIP() << missing;
  const Case c = GetParam();
  testing::TempDir dir;
  torch::manual_seed(3);
  auto model = models::make_model(c.model);
  randomize_batch_norms(*model);
  model->eval();
  models::save_state_dict(*model, dir / "weights.pt");

  const std::string onnx_path = dir / "model.onnx";
  const auto r = testing::run_command(kCli + " export --model " + c.model + " --weights " + (dir / "weights.pt") +
                                      " --out " + onnx_path + (c.fold_bn ? " --fold-bn" : ""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::cout << r.output;

  const auto shape = models::input_shape(c.model);
  for (const int64_t batch : {1, 37}) {
    const torch::Tensor x = torch::randn({batch, shape[0], shape[1], shape[2]});
    torch::Tensor expected;
    {
      torch::NoGradGuard no_grad;
      expected = model->forward(x);
    }
    const torch::Tensor got = testing::run_in_onnxruntime(onnx_path, x, dir.path());
    ASSERT_TRUE(got.defined());
    ASSERT_EQ(got.sizes(), expected.sizes());
    const double diff = (got - expected).abs().max().item<double>();
    std::cout << "[onnxruntime] " << std::left << std::setw(8) << c.model << (c.fold_bn ? " fold-bn" : " bn     ")
              << " batch " << std::setw(2) << batch << ": max abs diff " << std::scientific << std::setprecision(2)
              << diff << " (logits up to " << expected.abs().max().item<double>() << ")" << std::defaultfloat
              << std::endl;
    EXPECT_LE(diff, kTolerance) << c.model << " batch " << batch;
    RecordProperty(c.model + (c.fold_bn ? "_fold" : "") + "_batch" + std::to_string(batch) + "_max_abs_diff",
                   std::to_string(diff));
  }

  if (!testing::python_onnx_available()) GTEST_SKIP() << "onnx is not installed in the venv (scripts/bootstrap --test)";
  EXPECT_EQ(testing::python_onnx_check(onnx_path), "");
}

INSTANTIATE_TEST_SUITE_P(ReferenceModels, ExportOnnxRuntime,
                         ::testing::Values(Case{"mlp", false}, Case{"convnet", false}, Case{"convnet", true},
                                           Case{"resnet18", false}, Case{"resnet18", true}),
                         [](const auto& info) { return info.param.model + (info.param.fold_bn ? "_fold_bn" : ""); });

// A state dict Python wrote (torch.save(model.state_dict())), exported by lockstep, run in ONNX
// Runtime: its logits equal Python's own, with no LibTorch forward in between.
TEST(ExportOnnxRuntimeFromPython, TorchSaveFileGivesPythonsLogits) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  const std::string missing = testing::onnxruntime_missing();
  if (!missing.empty()) GTEST_SKIP() << missing;
  testing::TempDir dir;
  for (const std::string name : {"convnet", "resnet18"}) {
    const std::string weights = dir / (name + ".pt"), onnx_path = dir / (name + ".onnx");
    auto r = testing::run_command("cd " LOCKSTEP_SOURCE_DIR "/tests/python && " + python + " save_state_dict.py " +
                                  name + " " + weights);
    ASSERT_EQ(r.exit_code, 0) << r.output.substr(0, 2000);
    const auto j = nlohmann::json::parse(testing::last_json_line(r.output));
    r = testing::run_command(kCli + " export --model " + name + " --weights " + weights + " --out " + onnx_path);
    ASSERT_EQ(r.exit_code, 0) << r.output;

    // reference_models.py's fixed input: linspace(-1, 1) over two samples.
    const auto shape = models::input_shape(name);
    const torch::Tensor x = torch::linspace(-1, 1, 2 * shape[0] * shape[1] * shape[2]).reshape({2, shape[0], shape[1], shape[2]});
    const torch::Tensor got = testing::run_in_onnxruntime(onnx_path, x, dir.path()).flatten();
    const torch::Tensor python_logits = torch::tensor(j["logits"].get<std::vector<float>>());
    ASSERT_EQ(got.numel(), python_logits.numel());
    const double diff = (got - python_logits).abs().max().item<double>();
    std::cout << "[onnxruntime vs python torch] " << name << ": max abs diff " << diff << std::endl;
    EXPECT_LE(diff, kTolerance) << name;
  }
}

}  // namespace
}  // namespace lockstep
