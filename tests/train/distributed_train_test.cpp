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

void expect_equal_state(const std::string& a_path, const std::string& b_path) {
  auto a = load_state(a_path), b = load_state(b_path);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& entry : a)
    EXPECT_TRUE(torch::equal(entry.value().toTensor(), b.at(entry.key()).toTensor())) << entry.key().toStringRef();
}

// 2 epochs in one go, or 1 epoch and then `--resume latest` for the second: the same parameters,
// bit for bit (convnet: momentum buffers, batch-norm statistics and the data order all carry over).
TEST(DistributedTrain, ResumedRunEndsWhereAnUninterruptedRunEnds) {
  testing::TempDir dir;
  const std::string two_ranks = kCli + " run --nproc-per-node 2 -- " + kCli +
                                " train --quiet --model convnet --data synthetic --limit 600 --batch-size 50 --seed 5";
  auto straight = testing::run_command(two_ranks + " --epochs 2 --save-model " + (dir / "straight.pt"));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  auto first = testing::run_command(two_ranks + " --epochs 1 --checkpoint-dir " + (dir / "ckpt"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = testing::run_command(two_ranks + " --epochs 2 --checkpoint-dir " + (dir / "ckpt") +
                                     " --resume latest --save-model " + (dir / "resumed.pt"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_THAT(second.output, ::testing::HasSubstr("\"steps\":12"));  // 6 per epoch, counted from the start
  expect_equal_state(dir / "straight.pt", dir / "resumed.pt");
}

// --inject-nan spoils one rank's loss value but not its gradients: only the ranks' agreement can
// make the other rank skip too. Both ranks skip, so it does not matter which rank had the NaN,
// and the replicas end equal; a rank that stepped alone would leave rank 0's model different.
TEST(DistributedTrain, NanLossOnOneRankSkipsTheStepOnBothRanks) {
  testing::TempDir dir;
  const std::string two_ranks = kCli + " run --nproc-per-node 2 -- " + kCli +
                                " train --quiet --model mlp --data synthetic --limit 400 --batch-size 20 --seed 2";
  auto on_rank1 = testing::run_command(two_ranks + " --inject-nan 3@1 --save-model " + (dir / "r1.pt"));
  ASSERT_EQ(on_rank1.exit_code, 0) << on_rank1.output;
  EXPECT_THAT(on_rank1.output, ::testing::HasSubstr("step 4 skipped: non-finite loss on rank 1"));
  EXPECT_THAT(on_rank1.output, ::testing::HasSubstr("\"skipped_steps\":1"));
  auto on_rank0 = testing::run_command(two_ranks + " --inject-nan 3@0 --save-model " + (dir / "r0.pt"));
  ASSERT_EQ(on_rank0.exit_code, 0) << on_rank0.output;
  expect_equal_state(dir / "r1.pt", dir / "r0.pt");

  auto clean = testing::run_command(two_ranks + " --save-model " + (dir / "clean.pt"));
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  auto a = load_state(dir / "r1.pt"), b = load_state(dir / "clean.pt");
  EXPECT_FALSE(torch::equal(a.at("fc1.weight").toTensor(), b.at("fc1.weight").toTensor()))
      << "the skipped step left no trace";
}

// Every step non-finite: the run stops after --max-skipped-steps, saying so.
TEST(TrainCli, ConsecutiveSkipsAbortNamingTheLimit) {
  auto r = testing::run_command(kCli + " train --quiet --model mlp --data synthetic --limit 200 --batch-size 10 --lr 1e30 --max-skipped-steps 3");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("3 consecutive steps had a non-finite loss or gradient"));
  EXPECT_THAT(r.output, ::testing::HasSubstr("step 4 skipped: non-finite loss"));
  EXPECT_THAT(r.output, ::testing::HasSubstr("--max-skipped-steps=3"));
}

}  // namespace
}  // namespace lockstep::train
