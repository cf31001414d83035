// `lockstep train --strategy zero1|zero2` under `lockstep run`: two real processes over Gloo.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"

namespace lockstep::train {
namespace {

const std::string kCli = LOCKSTEP_CLI;

c10::Dict<c10::IValue, c10::IValue> load_state(const std::string& path) {
  return torch::pickle_load(read_file(path)).toGenericDict();
}

void expect_close_state(const std::string& a_path, const std::string& b_path, double tolerance) {
  auto a = load_state(a_path), b = load_state(b_path);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& entry : a) {
    const torch::Tensor ta = entry.value().toTensor(), tb = b.at(entry.key()).toTensor();
    EXPECT_LE((ta - tb).abs().max().item<double>(), tolerance) << entry.key().toStringRef();
  }
}

const std::string kTwoRanks = kCli + " run --nproc-per-node 2 -- " + kCli +
                              " train --quiet --model mlp --data synthetic --limit 400 --batch-size 20 --seed 4"
                              " --optimizer adam --lr 0.002";

// An epoch under zero2, checkpointed, then a second epoch resumed under ddp ends where two epochs
// of ddp end (Adam's moments and step counts carry over through the per-parameter layout); the
// same from a ddp checkpoint into zero1, from zero2 into fsdp and from fsdp into ddp. 1e-5: the
// gradients are summed in another order.
TEST(ZeroTrain, CheckpointsResumeAcrossStrategies) {
  testing::TempDir dir;
  auto straight = testing::run_command(kTwoRanks + " --strategy ddp --epochs 2 --save-model " + (dir / "straight.pt"));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  for (const auto& [first, second] : {std::pair<std::string, std::string>{"zero2", "ddp"}, {"ddp", "zero1"}, {"zero2", "fsdp"},
                                        {"fsdp", "ddp"}}) {
    const std::string ckpt = dir / (first + "-" + second + "-ckpt");
    auto one = testing::run_command(kTwoRanks + " --strategy " + first + " --epochs 1 --checkpoint-dir " + ckpt);
    ASSERT_EQ(one.exit_code, 0) << one.output;
    const std::string out = dir / (first + "-" + second + ".pt");
    auto two = testing::run_command(kTwoRanks + " --strategy " + second + " --epochs 2 --checkpoint-dir " + ckpt +
                                    " --resume latest --save-model " + out);
    ASSERT_EQ(two.exit_code, 0) << two.output;
    EXPECT_THAT(two.output, ::testing::HasSubstr("resumed from"));
    expect_close_state(dir / "straight.pt", out, 1e-5);
  }
}

// --report-memory: zero2 holds half of Adam's state and of the gradient per rank, and sends the
// ring's (N-1)/N x 4 bytes per parameter twice per step (reduce-scatter, all-gather), as ddp.
TEST(ZeroTrain, ReportMemoryShowsTheShardsAndTheBytesSentPerStep) {
  auto run = testing::run_command(kTwoRanks + " --strategy zero2 --report-memory");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // mlp: 203530 parameters, 2 x 101765 with padding; fp32.
  EXPECT_THAT(run.output, ::testing::HasSubstr("memory: parameters 0.78 MiB, gradients 0.39 MiB, optimizer 0.78 MiB"));
  EXPECT_THAT(run.output, ::testing::HasSubstr("sent 0.78 MiB per step"));
}

TEST(ZeroTrain, ZeroWithoutALauncherIsRefusedNamingTheFix) {
  auto r = testing::run_command(kCli + " train --quiet --model mlp --data synthetic --limit 100 --strategy zero1");
  EXPECT_EQ(r.exit_code, 2) << r.output;  // a usage error
  EXPECT_THAT(r.output, ::testing::HasSubstr("the zero1 strategy shards the optimizer state across ranks and needs a "
                                             "process group"));
  EXPECT_THAT(r.output, ::testing::HasSubstr("lockstep run --nproc-per-node N"));
}

}  // namespace
}  // namespace lockstep::train
