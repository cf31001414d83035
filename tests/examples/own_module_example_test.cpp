// examples/own_module, built out of tree against the installed package, run as a user runs it:
// a module of the user's own under each of the seven strategies ends where one process ends.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <map>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"

namespace lockstep {
namespace {

const std::string kLauncher = LOCKSTEP_CLI;
const std::string kOwnModule = std::string(LOCKSTEP_EXAMPLES_DIR) + "/own_module/own_module";

// The example's trained weights for `strategy`, on `ranks` processes (1: without a launcher).
std::map<std::string, torch::Tensor> trained(const testing::TempDir& dir, const std::string& strategy, int ranks,
                                             const std::string& extra = "") {
  const std::string out = dir / (strategy + (extra.empty() ? "" : "-extra") + ".pt");
  const std::string example =
      kOwnModule + " --strategy " + strategy + " --global-batch 32 --steps 20 --out " + out + extra;
  // Bounded: a rank that never arrives must fail the test, not hang it.
  const auto r = testing::run_command("timeout 120 " + (ranks == 1 ? example
                                                                   : kLauncher + " run --nproc-per-node " +
                                                                         std::to_string(ranks) + " -- " + example));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("at the first step")) << r.output;
  std::map<std::string, torch::Tensor> weights;
  for (const auto& e : torch::pickle_load(read_file(out)).toGenericDict())
    weights.emplace(e.key().toStringRef(), e.value().toTensor());
  return weights;
}

// SGD keeps the runs within 1e-5 on any CPU: a step is linear in the gradient, and the gradients
// of a batch split over replicas differ from the whole batch's only by the order of a sum
// (~1e-7 relative). dp splits the batch over threads in one process; ddp, zero1, zero2 and fsdp
// over 2 ranks; the pipeline cuts the model into 2 stages on 2 ranks, one replica of the batch.
TEST(OwnModuleExample, EveryStrategyEndsWhereOneProcessEnds) {
  testing::TempDir dir;
  const auto local = trained(dir, "local", 1);
  ASSERT_EQ(local.size(), 16u);  // stem, 2 x (norm, fc1, fc2), head: weights and biases
  for (const auto& [strategy, ranks] : std::vector<std::pair<std::string, int>>{
           {"dp", 1}, {"ddp", 2}, {"zero1", 2}, {"zero2", 2}, {"fsdp", 2}, {"pipeline", 2}}) {
    const auto other = trained(dir, strategy, ranks);
    ASSERT_EQ(other.size(), local.size()) << strategy;
    double worst = 0.0;
    for (const auto& [name, t] : local) worst = std::max(worst, (other.at(name) - t).abs().max().item<double>());
    EXPECT_LE(worst, 1e-5) << strategy;
    std::cout << "[ measured ] " << strategy << ": max |difference| from one process " << worst << "\n";
  }
  // The comparison can fail: training moved the weights far from where they started (lr 0).
  const auto untrained = trained(dir, "local", 1, " --lr 0");
  EXPECT_GT((local.at("stem.weight") - untrained.at("stem.weight")).abs().max().item<double>(), 1e-2);
}

}  // namespace
}  // namespace lockstep
