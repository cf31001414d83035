// examples/own_module, built out of tree against the installed package, run as a user runs it:
// a module of the user's own under each of the seven strategies ends where one process ends.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <map>

#include "../test_util.h"
#include "weights.h"

namespace lockstep {
namespace {

const std::string kLauncher = LOCKSTEP_CLI;
const std::string kOwnModule = std::string(LOCKSTEP_EXAMPLES_DIR) + "/own_module/own_module";

// The example's trained weights for `strategy`, on `ranks` processes (1: without a launcher).
std::map<std::string, torch::Tensor> trained(const testing::TempDir& dir, const std::string& strategy, int ranks,
                                             const std::string& extra = "", std::string* output = nullptr) {
  const std::string out = dir / (strategy + (extra.empty() ? "" : "-extra") + ".pt");
  const std::string example =
      kOwnModule + " --strategy " + strategy + " --global-batch 32 --steps 20 --out " + out + extra;
  // Bounded: a rank that never arrives must fail the test, not hang it.
  const auto r = testing::run_command("timeout 120 " + (ranks == 1 ? example
                                                                   : kLauncher + " run --nproc-per-node " +
                                                                         std::to_string(ranks) + " -- " + example));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("at the first step")) << r.output;
  if (output) *output = r.output;
  return testing::saved_weights(out);
}

// One process with the whole batch: what every strategy is compared with (trained once), and
// what it printed.
const std::map<std::string, torch::Tensor>& one_process(std::string* output = nullptr) {
  static testing::TempDir dir;
  static std::string printed;
  static const auto weights = trained(dir, "local", 1, "", &printed);
  if (output) *output = printed;
  return weights;
}

// SGD keeps the runs within 1e-5 on any CPU: a step is linear in the gradient, and the gradients
// of a batch split over replicas differ from the whole batch's only by the order of a sum
// (~1e-7 relative). dp splits the batch over threads in one process; ddp, zero1, zero2 and fsdp
// over 2 ranks; the pipeline cuts the model into 2 stages on 2 ranks, one replica of the batch.
class EveryStrategy : public ::testing::TestWithParam<std::pair<std::string, int>> {};

TEST_P(EveryStrategy, EndsWhereOneProcessEnds) {
  const auto& [strategy, ranks] = GetParam();
  const auto& local = one_process();
  ASSERT_EQ(local.size(), 16u);  // stem, 2 x (norm, fc1, fc2), head: weights and biases
  testing::TempDir dir;
  const auto other = trained(dir, strategy, ranks);
  ASSERT_EQ(other.size(), local.size());
  const double worst = testing::max_abs_difference(local, other);
  EXPECT_LE(worst, 1e-5);
  std::cout << "[ measured ] " << strategy << ": max |difference| from one process " << worst << "\n";
}

// The background loader through the installed headers (TrainerOptions::loader): 3 worker threads
// build the batches, and the run ends with the weights of the run without them, bit for bit.
TEST(OwnModuleExample, LoaderWorkersLeaveTheRunBitForBitUnchanged) {
  const auto& local = one_process();
  testing::TempDir dir;
  const auto with_workers = trained(dir, "local", 1, " --workers 3");
  ASSERT_EQ(with_workers.size(), local.size());
  EXPECT_EQ(testing::max_abs_difference(local, with_workers), 0.0);
}

INSTANTIATE_TEST_SUITE_P(OwnModuleExample, EveryStrategy,
                         ::testing::Values(std::make_pair(std::string("local"), 1), std::make_pair(std::string("dp"), 1),
                                           std::make_pair(std::string("ddp"), 2), std::make_pair(std::string("zero1"), 2),
                                           std::make_pair(std::string("zero2"), 2), std::make_pair(std::string("fsdp"), 2),
                                           std::make_pair(std::string("pipeline"), 2)),
                         [](const auto& info) { return info.param.first; });

// The comparison can fail: training moved the weights far from where they started (lr 0), and
// the held-out split, labelled by the same rule, is learnt.
TEST(OwnModuleExample, TrainingMovesTheWeightsAndLearnsTheHeldOutSplit) {
  testing::TempDir dir;
  std::string out, untrained_out;
  const auto untrained = trained(dir, "local", 1, " --lr 0", &untrained_out);
  EXPECT_GT((one_process(&out).at("stem.weight") - untrained.at("stem.weight")).abs().max().item<double>(), 1e-2);
  const auto accuracy = [](const std::string& text) {
    const auto at = text.find("held-out accuracy ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + 18));
  };
  EXPECT_GT(accuracy(out), 0.8) << out;             // 4 classes: chance is 0.25
  EXPECT_LT(accuracy(untrained_out), 0.5) << untrained_out;
}

}  // namespace
}  // namespace lockstep
