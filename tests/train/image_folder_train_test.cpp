// `lockstep train --data imagefolder` and `--data csv` as a user runs them: Fashion-MNIST written
// as PNG files by PIL (tests/python/image_folders.py), decoded as torchvision decodes them, trained
// under every strategy; the batches do not depend on the loader's workers, a resume mid-epoch
// continues them, a corrupt file is named, and workers cost little memory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "../python_script.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/torch_load.h"
#include "lockstep/data/image.h"
#include "lockstep/data/image_folder.h"
#include "lockstep/train/image_folder_data.h"

namespace lockstep::train {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kCli = LOCKSTEP_CLI;
const std::string kNormalize = "Grayscale(), ToTensor(), Normalize((0.2860,), (0.3530,))";
const std::string kAugment = "RandomCrop(28, padding=3), RandomHorizontalFlip(), " + kNormalize;

// 400 training and 100 held-out Fashion-MNIST images as PNG files, written once for the build.
class ImageFolderTrain : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { made_ = new testing::PythonFixture(testing::python_fixture("image_folders.py", "400 100")); }
  static void TearDownTestSuite() {
    delete made_;
    made_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(made_->error.empty()) << made_->error; }

  // A copy of the training folder this test may change.
  std::string copy_of_train(const testing::TempDir& into) const {
    std::filesystem::copy(at("fmnist/train"), into / "train", std::filesystem::copy_options::recursive);
    return into / "train";
  }

  // `lockstep train --quiet --data imagefolder` on the PNG folder for one epoch, with `args`, under
  // `lockstep run` when `ranks` > 1.
  static testing::CommandResult train(const std::string& args, int ranks = 1, const std::string& data_dir = "") {
    std::string command = "timeout 300 ";
    if (ranks > 1) command += kCli + " run --nproc-per-node " + std::to_string(ranks) + " -- ";
    command += kCli + " train --quiet --data imagefolder --data-dir " +
               (data_dir.empty() ? at("fmnist/train") : data_dir) + " --val-dir " + at("fmnist/val") +
               " --seed 3 --threads 1 " + args;
    if (args.find("--epochs") == std::string::npos) command += " --epochs 1";
    return testing::run_command(command);
  }

  static nlohmann::json summary(const testing::CommandResult& r) {
    const size_t rank0 = r.output.rfind("[rank 0] {");
    return nlohmann::json::parse(testing::last_json_line(rank0 == std::string::npos ? r.output : r.output.substr(rank0 + 9)));
  }

  // A fixture file or directory.
  static std::string at(const std::string& name) { return made_->dir + "/" + name; }

  static testing::PythonFixture* made_;
};
testing::PythonFixture* ImageFolderTrain::made_ = nullptr;

torch::Tensor read_tensor(const c10::Dict<c10::IValue, c10::IValue>& dict, const std::string& key) {
  return dict.at(key).toTensor();
}

std::vector<torch::Tensor> weights(const std::string& path) {
  std::vector<torch::Tensor> out;
  for (const auto& entry : torch_load(read_file(path)).toGenericDict()) out.push_back(entry.value().toTensor());
  return out;
}

bool same_weights(const std::string& a, const std::string& b) {
  const auto x = weights(a), y = weights(b);
  if (x.size() != y.size() || x.empty()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (!torch::equal(x[i], y[i])) return false;
  return true;
}

// The samples torchvision's ImageFolder gives (PIL's decoding, Grayscale, ToTensor, Normalize)
// are the ones lockstep's gives.
TEST_F(ImageFolderTrain, SamplesAreTorchvisionsWithTheSameTransforms) {
  auto folder = std::make_shared<const data::ImageFolder>(at("fmnist/train"));
  ImageFolderData ours(folder, ImageFolderDataOptions().transforms(data::Transforms::parse(kNormalize)));
  const auto theirs = torch_load(read_file(at("fmnist_batch.pt"))).toGenericDict();
  const Example batch = ours.get_batch({0, 1, 2, 3, 4, 5, 6, 7});
  const torch::Tensor expected = read_tensor(theirs, "data");
  ASSERT_EQ(batch.data.sizes(), expected.sizes());
  const double difference = (batch.data - expected).abs().max().item<double>();
  std::cout << "[ measured ] max |lockstep - torchvision| over 8 normalised samples: " << difference << "\n";
  EXPECT_LE(difference, 1e-6);
  EXPECT_TRUE(torch::equal(batch.target, read_tensor(theirs, "target")));
}

TEST_F(ImageFolderTrain, AConvnetLearnsFromPngFilesWithAugmentation) {
  const auto r = train("--model convnet --batch-size 20 --epochs 2 --workers 1 --transform '" + kAugment + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto s = summary(r);
  std::cout << "[ measured ] 400 PNG images, 2 epochs: test accuracy " << s["test_acc"] << "\n";
  EXPECT_GT(s["test_acc"].get<double>(), 0.4) << r.output;  // 10 classes: chance is 0.1
}

// The same run with 0, 2 and 4 loader workers, on 1 and on 2 ranks: bit for bit the same weights.
TEST_F(ImageFolderTrain, TheLoadersWorkersDoNotChangeARunBitForBit) {
  testing::TempDir out;
  for (int ranks : {1, 2}) {
    const std::string base = "--model convnet --batch-size 25 --transform '" + kAugment + "' --save-model ";
    const std::string reference = out / ("ranks" + std::to_string(ranks) + "_w0.pt");
    const auto r0 = train(base + reference + " --workers 0", ranks);
    ASSERT_EQ(r0.exit_code, 0) << r0.output;
    for (int workers : {2, 4}) {
      const std::string path = out / ("ranks" + std::to_string(ranks) + "_w" + std::to_string(workers) + ".pt");
      const auto r = train(base + path + " --workers " + std::to_string(workers) + " --prefetch 3", ranks);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_TRUE(same_weights(reference, path)) << ranks << " ranks, " << workers << " workers";
    }
  }
}

// Stopped after step 6 of 16 and resumed from its checkpoint with another worker count, the run
// ends with the weights of the run that was never stopped: the loader picks up the same batches
// with the same random crops and flips.
TEST_F(ImageFolderTrain, AResumeMidEpochContinuesTheSameBatchesBitForBit) {
  testing::TempDir out;
  const std::string base = "--model convnet --batch-size 25 --transform '" + kAugment + "' ";
  const auto whole = train(base + "--workers 2 --save-model " + out / "whole.pt");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const auto saved = train(base + "--workers 2 --checkpoint-dir " + out / "ckpt" + " --save-every 6");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const auto resumed = train(base + "--workers 3 --checkpoint-dir " + out / "ckpt" + " --resume " +
                             out / "ckpt/step-00000006.pt --save-model " + out / "resumed.pt");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("step 6"));
  EXPECT_TRUE(same_weights(out / "whole.pt", out / "resumed.pt"));
  // Other transforms would give other batches: such a resume is refused, naming both.
  const auto other = testing::run_command(
      "timeout 120 " + kCli + " train --quiet --data imagefolder --data-dir " + at("fmnist/train") +
      " --model convnet --batch-size 25 --seed 3 --threads 1 --transform '" + kNormalize + "' --checkpoint-dir " +
      out / "ckpt" + " --resume " + out / "ckpt/step-00000006.pt");
  EXPECT_NE(other.exit_code, 0) << other.output;
  EXPECT_THAT(other.output, HasSubstr("transform")) << other.output;
  EXPECT_THAT(other.output, HasSubstr("RandomCrop(28, padding=3)")) << other.output;
}

TEST_F(ImageFolderTrain, ACorruptImageIsNamedOrWithSkipBadSamplesCountedAndLeftOut) {
  testing::TempDir out;
  const std::string train_dir = copy_of_train(out);
  const std::string bad = data::ImageFolder(train_dir).path(17);
  std::filesystem::resize_file(bad, 40);  // a PNG cut inside its first chunk
  const std::string run = "--model convnet --batch-size 25 --workers 2 --transform '" + kNormalize + "'";
  const auto failed = train(run, 1, train_dir);
  EXPECT_EQ(failed.exit_code, 1) << failed.output;
  EXPECT_THAT(failed.output, HasSubstr(bad));
  const auto skipped = train(run + " --skip-bad-samples", 1, train_dir);
  ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_THAT(skipped.output, HasSubstr("warning: skipping"));
  EXPECT_THAT(skipped.output, HasSubstr(bad));
  EXPECT_EQ(summary(skipped)["bad_samples"].get<double>(), 1.0) << skipped.output;
}

TEST_F(ImageFolderTrain, FourWorkersPeakWithinATenthOfTheRssOfNone) {
  const std::string run = "--model convnet --batch-size 50 --transform '" + kAugment + "' --workers ";
  const auto none = train(run + "0");
  const auto four = train(run + "4");
  ASSERT_EQ(none.exit_code, 0) << none.output;
  ASSERT_EQ(four.exit_code, 0) << four.output;
  const double a = summary(none)["peak_rss_mib"].get<double>(), b = summary(four)["peak_rss_mib"].get<double>();
  std::cout << "[ measured ] peak RSS: 0 workers " << a << " MiB, 4 workers " << b << " MiB\n";
  EXPECT_LE(b, a * 1.10);
}

TEST_F(ImageFolderTrain, EveryStrategyTrainsFromTheFolder) {
  const std::vector<std::pair<std::string, int>> runs{
      {"--strategy local", 1},  {"--strategy dp --replicas 2", 1}, {"--strategy ddp", 2},
      {"--strategy zero1", 2},  {"--strategy zero2", 2},           {"--strategy fsdp", 2},
      {"--strategy pipeline --stages 2 --micro-batches 2", 2},     {"--strategy ddp --sync-bn", 2}};
  for (const auto& [args, ranks] : runs) {
    const auto r = train("--model convnet --limit 160 --batch-size 40 --workers 1 --transform '" + kAugment + "' " + args, ranks);
    EXPECT_EQ(r.exit_code, 0) << args << ":\n" << r.output;
  }
}

TEST_F(ImageFolderTrain, ImagesOfAnotherShapeThanTheModelsAreRefusedWithTheTransformToAdd) {
  const auto r = train("--model convnet --transform 'ToTensor()'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("model 'convnet' takes images of shape [1, 28, 28]"));
  EXPECT_THAT(r.output, HasSubstr("shape [3, 28, 28]"));
  EXPECT_THAT(r.output, HasSubstr("Grayscale()"));
  // Issue 53 item 16: without --transform the default is ToTensor(), as --help says (it was "").
  const auto by_default = train("--model convnet");
  EXPECT_EQ(by_default.exit_code, 2) << by_default.output;
  EXPECT_THAT(by_default.output, HasSubstr("shape [3, 28, 28]"));
  EXPECT_THAT(by_default.output, ::testing::Not(HasSubstr("no transforms")));
}

// Issue 53 item 17: images of mixed sizes without a Resize failed in LibTorch's "stack expects each
// tensor to be equal size", naming no file. The batch names two files, their shapes and the fix.
TEST(ImageFolderBatch, ImagesOfMixedSizesNameTheFilesAndTheResizeToAdd) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir / "cls");
  data::write_png(dir / "cls/a.png", torch::zeros({28, 28, 1}, torch::kUInt8));
  data::write_png(dir / "cls/b.png", torch::zeros({32, 30, 1}, torch::kUInt8));
  auto folder = std::make_shared<const data::ImageFolder>(dir.path());
  const ImageFolderData mixed(folder, ImageFolderDataOptions().transforms(data::Transforms::parse("ToTensor()")));
  const std::string message = testing::error_message([&] { mixed.get_batch({0, 1}); });
  EXPECT_THAT(message, HasSubstr("images of one batch differ in shape after the transforms: '" + dir / "cls/a.png" +
                                 "' gives [3, 28, 28] and '" + dir / "cls/b.png" + "' gives [3, 32, 30]"));
  EXPECT_THAT(message, HasSubstr("Resize((H, W))"));
  const ImageFolderData resized(folder,
                                ImageFolderDataOptions().transforms(data::Transforms::parse("Resize((28, 28)), ToTensor()")));
  EXPECT_EQ(resized.get_batch({0, 1}).data.sizes(), (std::vector<int64_t>{2, 3, 28, 28}));
}

// Two Gaussian blobs in 6 columns, labelled by name; mlp sized to the table learns them and is
// measured on a held-out quarter.
TEST(CsvTrain, AnMlpLearnsATableAndIsMeasuredOnAHeldOutSplit) {
  testing::TempDir dir;
  std::mt19937 random(5);
  std::normal_distribution<double> noise(0.0, 1.0);
  {
    std::ofstream csv(dir / "blobs.csv");
    csv << "f0,f1,f2,kind,f3,f4,f5\n";
    for (int i = 0; i < 400; ++i) {
      const double centre = i % 2 == 0 ? -1.5 : 1.5;
      for (int c = 0; c < 6; ++c) csv << centre + noise(random) << (c == 2 ? (i % 2 == 0 ? ",left," : ",right,") : c < 5 ? "," : "\n");
    }
  }
  const auto r = testing::run_command("timeout 120 " + kCli + " train --quiet --data csv --data-file " + dir / "blobs.csv" +
                                      " --label-column kind --model mlp --val-split 0.25 --epochs 3 --batch-size 20 "
                                      "--threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto s = nlohmann::json::parse(testing::last_json_line(r.output));
  std::cout << "[ measured ] two blobs, held-out accuracy " << s["test_acc"] << "\n";
  EXPECT_GT(s["test_acc"].get<double>(), 0.9);
  const auto refused = testing::run_command(kCli + " train --data csv --data-file " + dir / "blobs.csv" +
                                            " --label-column kind --model convnet");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("--data csv trains --model mlp"));
}

}  // namespace
}  // namespace lockstep::train
