// `lockstep train --strategy fsdp` under `lockstep run` (two real processes over Gloo), and
// checkpoints resumed across strategies and world sizes through the CLI.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"

namespace lockstep::train {
namespace {

using ::testing::HasSubstr;

const std::string kCli = LOCKSTEP_CLI;
const std::string kRun = " train --quiet --model mlp --data synthetic --limit 400 --seed 4 --optimizer adam --lr 0.002";
const std::string kTwoRanks = kCli + " run --nproc-per-node 2 -- " + kCli + kRun + " --batch-size 20";

void expect_close_state(const std::string& a_path, const std::string& b_path, double tolerance) {
  auto a = torch::pickle_load(read_file(a_path)).toGenericDict(), b = torch::pickle_load(read_file(b_path)).toGenericDict();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& entry : a) {
    const torch::Tensor ta = entry.value().toTensor(), tb = b.at(entry.key()).toTensor();
    EXPECT_LE((ta - tb).abs().max().item<double>(), tolerance) << entry.key().toStringRef();
  }
}

// (zero2 -> fsdp and fsdp -> ddp: ZeroTrain.CheckpointsResumeAcrossStrategies.) An epoch of fsdp
// on 2 ranks of batch 20, resumed by one process with the same global batch (batch 40), ends where
// two epochs of ddp on 2 ranks end, and says what changed. 1e-4, as
// DistributedTrain.AdamAndAdamWOnTwoRanksEndWhereOneProcessWithDoubleBatchEnds explains: OpenBLAS
// rounds a batch of 40 and two of 20 differently, and Adam magnifies rounding where a gradient
// nearly cancels.
TEST(FsdpTrain, TwoRankCheckpointResumesInOneProcess) {
  testing::TempDir dir;
  auto straight = testing::run_command(kTwoRanks + " --strategy ddp --epochs 2 --save-model " + (dir / "straight.pt"));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::string ckpt = dir / "ckpt";
  auto two = testing::run_command(kTwoRanks + " --strategy fsdp --epochs 1 --checkpoint-dir " + ckpt);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const std::string out = dir / "one-process.pt";
  auto one = testing::run_command(kCli + kRun + " --batch-size 40 --epochs 2 --resume " + ckpt +
                                  " --save-model " + out);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_THAT(one.output, HasSubstr("resumed from"));
  EXPECT_THAT(one.output, HasSubstr("was written by 2 data-parallel replica(s) of batch 20 (40 samples per "
                                    "step); this run "
                                    "has 1 of batch 40 (40). The global batch is the same"));
  expect_close_state(dir / "straight.pt", out, 1e-4);
}

// A 2-rank checkpoint taken mid-epoch (after 3 of 10 steps) resumes in one process of the same
// per-rank batch: twice the steps from there, with a warning that the data order differs.
TEST(FsdpTrain, AnotherGlobalBatchResumesWithAWarning) {
  testing::TempDir dir;
  const std::string ckpt = dir / "ckpt";
  auto two = testing::run_command(kTwoRanks + " --strategy fsdp --epochs 1 --save-every 3 --checkpoint-dir " + ckpt);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  auto one = testing::run_command(kCli + kRun + " --batch-size 20 --epochs 1 --resume " + ckpt + "/step-00000003.pt");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_THAT(one.output, HasSubstr("lockstep: warning: checkpoint '" + ckpt + "/step-00000003.pt' was written by 2 "
                                    "data-parallel replica(s) of batch 20"));
  EXPECT_THAT(one.output, HasSubstr("The data order differs from here on"));
  // 120 of 400 samples were consumed: 14 steps of 20 remain, ending at step 3 + 14.
  EXPECT_THAT(one.output, HasSubstr("\"steps\":17"));
}

// --report-memory: the shards (mlp: 203530 parameters, 101765 per rank) plus the units gathered at
// once: both (fc1 and fc2) with prefetch, the larger (fc1, 200960 parameters) with
// --fsdp-no-prefetch; and three times (N-1)/N x 4 bytes per parameter sent per step (two
// all-gathers and a reduce-scatter), against zero2's two, either way.
TEST(FsdpTrain, ReportMemoryShowsTheShardsTheGatheredUnitAndTheBytesSentPerStep) {
  for (const auto& [flags, param_bytes] : std::vector<std::pair<std::string, int64_t>>{
           {"", 4 * (101765 + 203530)}, {" --fsdp-no-prefetch", 4 * (101765 + 200960)}}) {
    auto run = testing::run_command(kTwoRanks + " --strategy fsdp --report-memory" + flags);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_THAT(run.output, HasSubstr("\"param_bytes\":" + std::to_string(param_bytes) + ",")) << flags;
    EXPECT_THAT(run.output, HasSubstr("gradients 0.39 MiB, optimizer 0.78 MiB")) << flags;
    EXPECT_THAT(run.output, HasSubstr("sent 1.16 MiB per step")) << flags;
  }
}

// Bad configurations fail before the first step, naming the fix.
TEST(FsdpTrain, BadConfigurationsFailBeforeTraining) {
  const std::string alone = kCli + " train --quiet --model mlp --data synthetic --limit 100";
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--strategy fsdp", "the fsdp strategy shards the parameters across ranks and needs a process group"},
           {"--strategy ddp", "the ddp strategy needs a process group"},
           {"--fsdp-min-params 1000", "--fsdp-min-params, --fsdp-no-reshard-after-forward and --fsdp-no-prefetch set "
                                      "FSDP's units: add --strategy fsdp"},
           {"--fsdp-no-prefetch", "FSDP's units: add --strategy fsdp"},
           {"--strategy fsdp --checkpoint-activations", "--checkpoint-activations with --strategy fsdp"},
           {"--strategy fsdp3", "fsdp3"}}) {
    auto r = testing::run_command(alone + " " + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.output;  // a usage error
    EXPECT_THAT(r.output, HasSubstr(message)) << flags;
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr("epoch 1"))) << flags;
  }
}

}  // namespace
}  // namespace lockstep::train
