// examples/ddp_train, the program users copy, run as they run it: under `lockstep run` on 2 ranks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <regex>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/data/dataset.h"

namespace lockstep {
namespace {

const std::string kCli = LOCKSTEP_CLI;
const std::string kExample = std::string(LOCKSTEP_EXAMPLES_DIR) + "/ddp_train/ddp_train";

bool have_fashion_mnist() {
  return ::access((std::string(data::kDefaultFashionMnistDir) + "/train-images-idx3-ubyte.gz").c_str(), R_OK) == 0;
}

// 1200 Fashion-MNIST samples, 2 ranks x batch 50: 12 steps an epoch, about a second each on 2 cores.
testing::CommandResult run_example(const testing::TempDir& dir, const std::string& name, const std::string& args) {
  const std::string log = dir / (name + ".log");
  std::vector<std::string> argv = {kCli, "run", "--nproc-per-node", "2", "--", kExample,
                                   "--limit", "1200", "--batch-size", "50", "--seed", "1"};
  std::istringstream words(args);
  for (std::string w; words >> w;) argv.push_back(w);
  testing::ChildProcess child(argv, log);
  const std::optional<int> code = child.wait_for(std::chrono::seconds(30));
  return {code.value_or(-1), testing::read_text(log) + (code ? "" : "\n<killed after 30 s>")};
}

struct EpochLine {
  int epoch;
  double first_step_loss;
  double mean_loss;
};

// The example's per-epoch lines, as rank 0 prints them.
std::vector<EpochLine> epoch_lines(const std::string& output) {
  static const std::regex line(R"(\[rank 0\] epoch (\d+)/\d+: loss ([0-9.]+) at the first step, ([0-9.]+) mean)");
  std::vector<EpochLine> out;
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it)
    out.push_back({std::stoi((*it)[1]), std::stod((*it)[2]), std::stod((*it)[3])});
  return out;
}

c10::impl::GenericDict load_checkpoint(const std::string& path) {
  return torch::pickle_load(read_file(path)).toGenericDict();
}

TEST(DdpTrainExample, TrainsOnTwoRanksAndWritesACheckpointPythonLoads) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  testing::TempDir dir;
  auto r = run_example(dir, "run", "--epochs 2 --checkpoint " + (dir / "ckpt.pt"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("[rank 0] world size 2, 1200 Fashion-MNIST samples"));
  EXPECT_THAT(r.output, ::testing::Not(::testing::HasSubstr("[rank 1] epoch")));  // rank 0 prints

  const auto epochs = epoch_lines(r.output);
  ASSERT_EQ(epochs.size(), 2u) << r.output;
  // Untrained, the loss is about ln(10) = 2.30; after 24 steps on real data it must have fallen well below.
  EXPECT_NEAR(epochs[0].first_step_loss, std::log(10.0), 0.3) << r.output;
  EXPECT_LT(epochs[1].mean_loss, 0.75 * epochs[0].first_step_loss) << r.output;
  EXPECT_LT(epochs[1].mean_loss, epochs[0].mean_loss) << r.output;

  // Python reads the file, its reference ConvNet takes the weights with strict key and shape checks,
  // and torch.optim.SGD takes the optimizer state (a momentum buffer per parameter).
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  const std::string script =
      "import sys, torch; sys.path.insert(0, sys.argv[2]); from reference_models import ConvNet; "
      "c = torch.load(sys.argv[1]); m = ConvNet(); m.load_state_dict(c['model']); "
      "o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9); o.load_state_dict(c['optimizer']); "
      "print(sorted(c), c['epoch'], sorted(c['scaler']), len(o.state))";
  auto py = testing::run_command(python + " -c \"" + script + "\" " + (dir / "ckpt.pt") + " " +
                                 LOCKSTEP_SOURCE_DIR + "/tests/python");
  ASSERT_EQ(py.exit_code, 0) << py.output;
  EXPECT_EQ(py.output,
            "['epoch', 'model', 'optimizer', 'scaler'] 2 "
            "['_growth_tracker', 'backoff_factor', 'growth_factor', 'growth_interval', 'scale'] 10\n");
}

// A job that ends after epoch 1 (as one killed between epochs does: its checkpoint is all that is
// left) and is restarted with --resume for epoch 2 ends with exactly the weights, BatchNorm
// statistics and scaler state of a job that ran both epochs. Bit for bit: the checkpoint holds
// everything the second epoch reads (weights, buffers, momentum, scale, the epoch that seeds the
// shuffle), the model has no randomness (no dropout), and on the same machine with the same thread
// count every kernel, and the 2-rank all-reduce (a + b = b + a), is deterministic.
TEST(DdpTrainExample, ResumedAfterEpochOneEndsWithTheWeightsOfAnUninterruptedRun) {
  testing::TempDir dir;
  auto straight = run_example(dir, "straight", "--epochs 2 --checkpoint " + (dir / "straight.pt"));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  auto first = run_example(dir, "first", "--epochs 1 --checkpoint " + (dir / "resumed.pt"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto after_one = load_checkpoint(dir / "resumed.pt");
  ASSERT_EQ(after_one.at("epoch").toInt(), 1);
  auto second = run_example(dir, "second", "--epochs 2 --resume " + (dir / "resumed.pt") + " --checkpoint " +
                                               (dir / "resumed.pt"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_THAT(second.output, ::testing::HasSubstr("from epoch 2\n"));
  ASSERT_EQ(epoch_lines(second.output).size(), 1u) << second.output;  // epoch 1 is not trained again

  const auto a = load_checkpoint(dir / "straight.pt"), b = load_checkpoint(dir / "resumed.pt");
  EXPECT_EQ(b.at("epoch").toInt(), 2);
  const auto model_a = a.at("model").toGenericDict(), model_b = b.at("model").toGenericDict();
  const auto model_one = after_one.at("model").toGenericDict();
  ASSERT_EQ(model_a.size(), model_b.size());
  for (const auto& entry : model_a) {
    const std::string& key = entry.key().toStringRef();
    const torch::Tensor ta = entry.value().toTensor(), tb = model_b.at(key).toTensor();
    EXPECT_TRUE(torch::equal(ta, tb)) << key << ": max difference " << (ta - tb).abs().max().item<double>();
  }
  // The comparison can fail: the second epoch moved the weights away from the first's.
  EXPECT_FALSE(torch::equal(model_a.at("fc.weight").toTensor(), model_one.at("fc.weight").toTensor()));
  const auto scaler_a = a.at("scaler").toGenericDict(), scaler_b = b.at("scaler").toGenericDict();
  EXPECT_EQ(scaler_a.at("scale").toDouble(), scaler_b.at("scale").toDouble());
  EXPECT_EQ(scaler_a.at("_growth_tracker").toInt(), scaler_b.at("_growth_tracker").toInt());
}

}  // namespace
}  // namespace lockstep
