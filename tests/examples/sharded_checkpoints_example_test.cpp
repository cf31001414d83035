// examples/sharded_checkpoints, built out of tree against the installed package and run on two
// ranks under `lockstep run`: a run stopped after an epoch and resumed from its sharded
// checkpoint ends bit for bit where an uninterrupted run ends, and Python reads the files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <map>

#include "../test_util.h"
#include "weights.h"

namespace lockstep {
namespace {

const std::string kExample = std::string(LOCKSTEP_EXAMPLES_DIR) + "/sharded_checkpoints/sharded_checkpoints";

// Runs the example on 2 ranks; returns its output. Bounded: a rank that never arrives fails the test.
std::string run_example(const std::string& args) {
  const auto r = testing::run_command("timeout 120 " + std::string(LOCKSTEP_CLI) + " run --nproc-per-node 2 -- " +
                                      kExample + " " + args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

using testing::saved_weights;

class ShardedCheckpointsExample : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardedCheckpointsExample, ResumedRunEndsBitForBitWhereAnUninterruptedRunEnds) {
  const std::string strategy = GetParam();
  testing::TempDir dir;
  const std::string common = "--strategy " + strategy + " --samples 256 --batch-size 16 ";
  run_example(common + "--epochs 3 --checkpoint-dir " + dir / "whole" + " --out " + dir / "whole.pt");
  run_example(common + "--epochs 1 --checkpoint-dir " + dir / "parts" + " --out " + dir / "one.pt");
  const std::string resumed =
      run_example(common + "--epochs 3 --checkpoint-dir " + dir / "parts" + " --resume latest --out " + dir / "parts.pt");
  EXPECT_THAT(resumed, ::testing::HasSubstr("2 epoch(s) trained this run, 24 steps in all"));  // 256 / (2 x 16) a epoch

  const auto whole = saved_weights(dir / "whole.pt"), parts = saved_weights(dir / "parts.pt");
  ASSERT_EQ(whole.size(), 6u);  // hidden1, hidden2, head: weights and biases
  for (const auto& [name, t] : whole) EXPECT_TRUE(torch::equal(t, parts.at(name))) << name;
  // The last two epochs moved them: the comparison can fail.
  EXPECT_FALSE(torch::equal(saved_weights(dir / "one.pt").at("head.weight"), whole.at("head.weight")));
  EXPECT_TRUE(std::filesystem::is_directory(dir / "parts/step-00000024")) << "one directory per save";

  const std::string python = testing::python_with_torch();
  ASSERT_FALSE(python.empty()) << "python3-torch is not installed: scripts/bootstrap installs it";
  // Python's torch.load reads a rank's file (its half of each shard) and the metadata.
  const std::string step = dir / "parts/step-00000024";
  const auto r = testing::run_command(
      python + " -c \"import torch, json; f = torch.load('" + step + "/rank-00001-of-00002.pt'); m = torch.load('" +
      step + "/metadata.pt'); print(json.dumps({'rank': f['rank'], 'world': m['world_size'], 'strategy': "
      "m['strategy'], 'step': m['position']['step'], 'shard_elements': sum(v.numel() for v in f['shards'].values())}))\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(testing::last_json_line(r.output));
  EXPECT_EQ(j["rank"], 1);
  EXPECT_EQ(j["world"], 2);
  EXPECT_EQ(j["strategy"], strategy);
  EXPECT_EQ(j["step"], 24);
  int64_t elements = 0;
  for (const auto& [name, t] : whole) elements += t.numel();
  EXPECT_EQ(j["shard_elements"], elements / 2);  // 32x64+64 + 64x64+64 + 64x8+8 = 6792, halved
}

INSTANTIATE_TEST_SUITE_P(Strategies, ShardedCheckpointsExample, ::testing::Values("zero2", "fsdp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lockstep
