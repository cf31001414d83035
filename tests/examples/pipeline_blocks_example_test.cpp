// examples/pipeline_blocks, built out of tree against the installed package and run on two ranks
// under `lockstep run`: a pipeline of the user's blocks ends where one process ends, a resumed
// pipeline ends where an uninterrupted one ends, and Python reads its checkpoint.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <iostream>
#include <map>

#include "../test_util.h"
#include "weights.h"

namespace lockstep {
namespace {

const std::string kExample = std::string(LOCKSTEP_EXAMPLES_DIR) + "/pipeline_blocks/pipeline_blocks";

// Runs the example (on 2 ranks under the launcher, or as one process); returns its output.
std::string run_example(const std::string& args, int ranks = 2) {
  const std::string launcher =
      ranks == 1 ? "" : std::string(LOCKSTEP_CLI) + " run --nproc-per-node " + std::to_string(ranks) + " -- ";
  const auto r = testing::run_command("timeout 120 " + launcher + kExample + " " + args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

using testing::max_abs_difference;
using testing::saved_weights;

// SGD on the same batches: the pipeline's micro-batches and stages change only the order of sums.
TEST(PipelineBlocksExample, TwoStagesEndWhereOneProcessEndsUnderBothSchedules) {
  testing::TempDir dir;
  const std::string out = run_example("--strategy local --out " + dir / "local.pt", 1);
  const auto local = saved_weights(dir / "local.pt");
  ASSERT_EQ(local.size(), 12u);  // input, 4 gated convolutions, head: weights and biases
  for (const std::string& args : {std::string("--micro-batches 4 --schedule gpipe"),
                                  std::string("--micro-batches 8 --schedule 1f1b --split 2,4")}) {
    run_example(args + " --out " + dir / "pipeline.pt");
    const double worst = max_abs_difference(local, saved_weights(dir / "pipeline.pt"));
    EXPECT_LE(worst, 1e-5) << args;
    std::cout << "[ measured ] pipeline " << args << ": max |difference| from one process " << worst << "\n";
  }
  // Training moved the weights (the comparison can fail) and learnt the held-out split.
  run_example("--strategy local --epochs 1 --samples 32 --out " + dir / "barely.pt", 1);
  EXPECT_GT(max_abs_difference(local, saved_weights(dir / "barely.pt")), 1e-2);
  const auto at = out.find("held-out accuracy ");
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_GT(std::stod(out.substr(at + 18)), 0.6) << out;  // 5 classes: chance is 0.2
}

TEST(PipelineBlocksExample, ResumedPipelineEndsBitForBitAndPythonReadsItsCheckpoint) {
  testing::TempDir dir;
  run_example("--epochs 2 --checkpoint-dir " + dir / "whole" + " --out " + dir / "whole.pt");
  run_example("--epochs 1 --checkpoint-dir " + dir / "parts");
  run_example("--epochs 2 --checkpoint-dir " + dir / "parts" + " --resume latest --out " + dir / "parts.pt");
  const auto whole = saved_weights(dir / "whole.pt"), parts = saved_weights(dir / "parts.pt");
  ASSERT_EQ(whole.size(), 12u);
  for (const auto& [name, t] : whole) EXPECT_TRUE(torch::equal(t, parts.at(name))) << name;

  const std::string python = testing::python_with_torch();
  ASSERT_FALSE(python.empty()) << "python3-torch is not installed: scripts/bootstrap installs it";
  // The whole model in one file (512 samples / 32 a step = 16 steps an epoch), gathered from both stages.
  const auto r = testing::run_command(
      python + " -c \"import torch, json; c = torch.load('" + dir / "parts/step-00000032.pt" +
      "'); print(json.dumps({'keys': sorted(c['model']), 'step': c['position']['step']}))\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(testing::last_json_line(r.output));
  EXPECT_EQ(j["step"], 32);
  std::vector<std::string> keys;
  for (const auto& [name, t] : whole) keys.push_back(name);
  EXPECT_EQ(j["keys"], nlohmann::json(keys));
}

}  // namespace
}  // namespace lockstep
