// `lockstep train` under `lockstep run`: two real processes over Gloo against one process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <fstream>

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

// 2 epochs in one go, or 1 epoch and then `--resume latest` for the second, on 2 ranks with the
// convnet and the options `extra`: returns the resumed run's output after checking that both end
// with the same parameters, bit for bit (optimizer state, batch-norm statistics and the data order
// all carry over).
std::string expect_resume_ends_where_straight_run_ends(const testing::TempDir& dir, const std::string& extra) {
  const std::string two_ranks = kCli + " run --nproc-per-node 2 -- " + kCli +
                                " train --quiet --model convnet --data synthetic --limit 600 --batch-size 50 --seed 5" +
                                extra;
  auto straight = testing::run_command(two_ranks + " --epochs 2 --save-model " + (dir / "straight.pt"));
  EXPECT_EQ(straight.exit_code, 0) << straight.output;
  auto first = testing::run_command(two_ranks + " --epochs 1 --checkpoint-dir " + (dir / "ckpt"));
  EXPECT_EQ(first.exit_code, 0) << first.output;
  auto second = testing::run_command(two_ranks + " --epochs 2 --checkpoint-dir " + (dir / "ckpt") +
                                     " --resume latest --save-model " + (dir / "resumed.pt"));
  EXPECT_EQ(second.exit_code, 0) << second.output;
  expect_equal_state(dir / "straight.pt", dir / "resumed.pt");
  return second.output;
}

TEST(DistributedTrain, ResumedRunEndsWhereAnUninterruptedRunEnds) {
  testing::TempDir dir;
  const std::string resumed = expect_resume_ends_where_straight_run_ends(dir, "");
  EXPECT_THAT(resumed, ::testing::HasSubstr("\"steps\":12"));  // 6 per epoch, counted from the start
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

// Adam and AdamW through the ddp strategy: 2 ranks x B == 1 process x 2B (the optimizers see the
// same averaged gradients), within 1e-4, 5% of one step at lr 0.002. The gradients differ by
// rounding only (OpenBLAS blocks a batch of 20 and one of 40 differently), but Adam divides each
// gradient by its own running scale, so a weight whose gradient nearly cancels can move by a good
// part of lr on rounding alone; with the reference BLAS the difference was under 1e-5, with
// OpenBLAS it is 2.5e-5.
TEST(DistributedTrain, AdamAndAdamWOnTwoRanksEndWhereOneProcessWithDoubleBatchEnds) {
  for (const std::string optimizer : {"adam", "adamw"}) {
    testing::TempDir dir;
    const std::string common = " train --quiet --model mlp --data synthetic --limit 400 --epochs 2 --seed 3 --optimizer " +
                               optimizer + " --lr 0.002";
    auto two = testing::run_command(kCli + " run --nproc-per-node 2 -- " + kCli + common + " --batch-size 20 --save-model " +
                                    (dir / "two.pt"));
    ASSERT_EQ(two.exit_code, 0) << two.output;
    auto one = testing::run_command(kCli + common + " --batch-size 40 --save-model " + (dir / "one.pt"));
    ASSERT_EQ(one.exit_code, 0) << one.output;
    auto a = load_state(dir / "two.pt"), b = load_state(dir / "one.pt");
    for (const auto& entry : a) {
      const torch::Tensor ta = entry.value().toTensor(), tb = b.at(entry.key()).toTensor();
      EXPECT_LE((ta - tb).abs().max().item<double>(), 1e-4) << optimizer << " " << entry.key().toStringRef();
    }
  }
}

// Adam's moments and step counts travel through the checkpoint; an sgd run refuses to resume it.
TEST(DistributedTrain, AdamWResumedRunEndsWhereAnUninterruptedRunEnds) {
  testing::TempDir dir;
  expect_resume_ends_where_straight_run_ends(dir, " --optimizer adamw");
  auto sgd = testing::run_command(kCli + " train --quiet --model convnet --data synthetic --limit 600 --batch-size 50"
                                  " --seed 5 --epochs 2 --checkpoint-dir " + (dir / "ckpt") + " --resume latest");
  EXPECT_NE(sgd.exit_code, 0) << sgd.output;
  EXPECT_THAT(sgd.output, ::testing::HasSubstr("optimizer=adamw in the checkpoint but sgd in this run"));
}

// Two ranks started with different models (rank 0 an mlp, rank 1 a convnet; started by hand with
// the launcher's variables, so each rank's own exit code is seen): both end within 30 s with DDP's
// error naming the first differing parameter and both shapes, exit code 1, and neither dies by a
// signal inside Gloo (which a weight broadcast of mismatched sizes caused).
TEST(DistributedTrain, MismatchedModelsEndBothRanksWithTheFirstDifference) {
  testing::TempDir dir;
  const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(testing::free_port_pair()) +
                          " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 ";
  const std::string train = kCli + " train --quiet --data synthetic --limit 100 --precision bf16 --opt-level O2";
  const auto start = std::chrono::steady_clock::now();
  auto r = testing::run_command(
      "sh -c '" + env + "RANK=0 LOCAL_RANK=0 " + train + " --model mlp > " + (dir / "r0") + " 2>&1 & a=$!; " + env +
      "RANK=1 LOCAL_RANK=1 " + train + " --model convnet > " + (dir / "r1") + " 2>&1 & b=$!; " +
      "wait $a; echo rank0=$?; wait $b; echo rank1=$?'");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_THAT(r.output, ::testing::HasSubstr("rank0=1\nrank1=1")) << r.output;
  const std::string r0 = testing::read_text(dir / "r0"), r1 = testing::read_text(dir / "r1");
  for (const std::string& out : {r0, r1})
    EXPECT_THAT(out, ::testing::HasSubstr("lockstep: error: DistributedDataParallel: the model differs across ranks"));
  EXPECT_THAT(r1, ::testing::HasSubstr("rank 1 has parameter 'layer1.0.weight' [16, 1, 5, 5] Float where rank 0 "
                                       "has parameter 'fc1.weight' [256, 784] Float"));
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
