// `lockstep train --sync-bn` under `lockstep run`: two real processes over Gloo against one process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"

namespace lockstep::train {
namespace {

using ::testing::HasSubstr;

const std::string kCli = LOCKSTEP_CLI;

c10::Dict<c10::IValue, c10::IValue> load_state(const std::string& path) {
  return torch::pickle_load(read_file(path)).toGenericDict();
}

// The largest difference over the state dicts' entries, and its key.
std::pair<double, std::string> largest_difference(const std::string& a_path, const std::string& b_path) {
  auto a = load_state(a_path), b = load_state(b_path);
  EXPECT_EQ(a.size(), b.size());
  std::pair<double, std::string> worst{0.0, ""};
  for (const auto& entry : a) {
    const torch::Tensor ta = entry.value().toTensor().to(torch::kDouble);
    const double d = (ta - b.at(entry.key()).toTensor().to(torch::kDouble)).abs().max().item<double>();
    if (d > worst.first) worst = {d, entry.key().toStringRef()};
  }
  return worst;
}

// 2 ranks x 50 with --sync-bn == 1 process x 100 with plain BatchNorm, within 1e-5 in every
// weight and running statistic after 2 epochs (the DistributedSampler gives the two ranks the
// single process's batch, SyncBatchNorm normalises over both halves, DDP averages the gradients).
// Without --sync-bn, each rank normalises its own 50 samples and the runs part.
TEST(SyncBnTrain, TwoRanksWithSyncBnEndWhereOneProcessWithPlainBatchNormEnds) {
  testing::TempDir dir;
  const std::string common = " train --quiet --model convnet --data synthetic --limit 400 --epochs 2 --seed 4";
  const std::string two_ranks = kCli + " run --nproc-per-node 2 -- " + kCli + common + " --batch-size 50";
  auto sync = testing::run_command(two_ranks + " --sync-bn --save-model " + (dir / "sync.pt"));
  ASSERT_EQ(sync.exit_code, 0) << sync.output;
  auto one = testing::run_command(kCli + common + " --batch-size 100 --save-model " + (dir / "one.pt"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto local_bn = testing::run_command(two_ranks + " --save-model " + (dir / "local.pt"));
  ASSERT_EQ(local_bn.exit_code, 0) << local_bn.output;

  const auto [sync_diff, sync_key] = largest_difference(dir / "sync.pt", dir / "one.pt");
  EXPECT_LE(sync_diff, 1e-5) << sync_key;
  const auto [local_diff, local_key] = largest_difference(dir / "local.pt", dir / "one.pt");
  EXPECT_GT(local_diff, 1e-3) << "per-rank BatchNorm matched the global batch too (" << local_key << ")";
}

TEST(SyncBnTrain, SyncBnWithoutBatchNormOrWithoutLauncherFailsBeforeTraining) {
  auto mlp = testing::run_command(kCli + " train --quiet --model mlp --data synthetic --limit 100 --sync-bn");
  EXPECT_EQ(mlp.exit_code, 2) << mlp.output;
  EXPECT_THAT(mlp.output, HasSubstr("--sync-bn: model 'mlp' has no BatchNorm layer to synchronise; choose one that has "
                                    "(convnet, resnet18) or drop --sync-bn"));
  auto alone = testing::run_command(kCli + " train --quiet --model convnet --data synthetic --limit 100 --sync-bn");
  EXPECT_EQ(alone.exit_code, 2) << alone.output;
  EXPECT_THAT(alone.output, HasSubstr("--sync-bn synchronises BatchNorm across ranks, but this run is one process"));
  EXPECT_THAT(alone.output, HasSubstr("lockstep run --nproc-per-node N"));
  EXPECT_THAT(alone.output, ::testing::Not(HasSubstr("epoch 1")));
}

}  // namespace
}  // namespace lockstep::train
