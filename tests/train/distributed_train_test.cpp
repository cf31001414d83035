// `lockstep train` under `lockstep run`: two real processes over Gloo against one process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"

namespace lockstep::train {
namespace {

const std::string kCli = LOCKSTEP_CLI;

c10::Dict<c10::IValue, c10::IValue> load_state(const std::string& path) {
  return torch::pickle_load(read_file(path)).toGenericDict();
}

// 2 ranks x batch B == 1 process x batch 2B: the DistributedSampler gives the two ranks, step by
// step, exactly the samples of the single process's batch, and DDP averages their gradients.
TEST(DistributedTrain, TwoRanksEndWhereOneProcessWithDoubleBatchEnds) {
  testing::TempDir dir;
  const std::string common = " train --quiet --model mlp --data synthetic --limit 800 --epochs 2 --seed 3";
  auto two = testing::run_command(kCli + " run --nproc-per-node 2 -- " + kCli + common +
                                  " --batch-size 20 --save-model " + (dir / "two.pt"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  auto one = testing::run_command(kCli + common + " --batch-size 40 --save-model " + (dir / "one.pt"));
  ASSERT_EQ(one.exit_code, 0) << one.output;

  // Only rank 0 prints the summary, with the world size and global throughput.
  EXPECT_THAT(two.output, ::testing::HasSubstr("[rank 0] {\"world_size\":2"));
  EXPECT_THAT(two.output, ::testing::Not(::testing::HasSubstr("[rank 1] {")));

  auto a = load_state(dir / "two.pt"), b = load_state(dir / "one.pt");
  ASSERT_EQ(a.size(), 4u);
  for (const auto& entry : a) {
    const torch::Tensor ta = entry.value().toTensor();
    const torch::Tensor tb = b.at(entry.key()).toTensor();
    EXPECT_LE((ta - tb).abs().max().item<double>(), 1e-5) << entry.key().toStringRef();
  }
}

}  // namespace
}  // namespace lockstep::train
