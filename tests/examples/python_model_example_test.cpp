// examples/python_model, built out of tree against the installed package and run as a user runs
// it: a model scripted in Python (tests/python/torchscript_models.py's residual MLP) trained by a
// C++ program under zero2 and fsdp on 2 ranks ends where one process with the double batch ends,
// and Python's torch.jit.load runs the trained file to the logits C++ computes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/torch_save.h"
#include "lockstep/models/torchscript_module.h"

namespace lockstep {
namespace {

const std::string kLauncher = LOCKSTEP_CLI;
const std::string kExample = std::string(LOCKSTEP_EXAMPLES_DIR) + "/python_model/python_model";

TEST(PythonModelExample, TrainsPythonsModelUnderZero2AndFsdpAndPythonRunsTheResult) {
  const std::string python = testing::python_with_torch();
  ASSERT_FALSE(python.empty()) << testing::kNoPythonTorch;
  testing::TempDir dir;
  const auto made = testing::run_command(python + " " + LOCKSTEP_SOURCE_DIR + "/tests/python/torchscript_models.py " +
                                         dir.path());
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto run = [&](const std::string& strategy, int ranks, int batch) {
    const std::string out = dir / (strategy + ".pt");
    const std::string example = kExample + " --model " + (dir / "image_mlp.pt") + " --limit 400 --strategy " + strategy +
                                " --batch-size " + std::to_string(batch) + " --out " + out;
    const auto r = testing::run_command(
        "timeout 120 " + (ranks == 1 ? example : kLauncher + " run --nproc-per-node " + std::to_string(ranks) + " -- " + example));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, ::testing::HasSubstr("test accuracy")) << r.output;
    return models::TorchScriptModule(out);
  };
  const models::TorchScriptModule one = run("local", 1, 40);
  const models::TorchScriptModule initial(dir / "image_mlp.pt");
  EXPECT_GT((one->named_parameters()["head.weight"] - initial->named_parameters()["head.weight"]).abs().max().item<double>(),
            1e-3);  // it trained
  for (const std::string strategy : {"zero2", "fsdp"}) {
    const models::TorchScriptModule two = run(strategy, 2, 20);
    double worst = 0;
    for (const auto& p : one->named_parameters())
      worst = std::max(worst, (p.value() - two->named_parameters()[p.key()]).abs().max().item<double>());
    std::cout << "[ measured ] " << strategy << " on 2 ranks against one process: max |difference| " << worst << "\n";
    EXPECT_LE(worst, 1e-5) << strategy;
  }

  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  const torch::Tensor x = torch::randn({3, 1, 28, 28}, gen);
  write_file_atomic(dir / "x.pt", torch_save(x));
  // -W: PyTorch 2.x warns that TorchScript is deprecated, on stderr, which run_command interleaves.
  const auto py = testing::run_command(python + " -W ignore::FutureWarning -c \"import json, torch; m = torch.jit.load('" + (dir / "fsdp.pt") +
                                       "').eval(); print(json.dumps(m(torch.load('" + (dir / "x.pt") + "')).tolist()))\"");
  ASSERT_EQ(py.exit_code, 0) << py.output;
  std::vector<torch::Tensor> rows;
  for (const auto& row : nlohmann::json::parse(py.output))
    rows.push_back(torch::tensor(row.get<std::vector<float>>()));
  models::TorchScriptModule trained(dir / "fsdp.pt");
  trained->eval();
  const double difference = (torch::stack(rows) - trained->forward(x)).abs().max().item<double>();
  std::cout << "[ measured ] Python's torch.jit.load of the trained file against C++: max |difference| " << difference << "\n";
  EXPECT_LE(difference, 1e-6);
}

}  // namespace
}  // namespace lockstep
