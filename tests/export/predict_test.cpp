// `lockstep predict`: its accuracy and confusion matrix against the Predictor's own evaluation, the
// files it reads, and its latency figures' consistency.
#include "lockstep/export/prediction_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fstream>
#include <iostream>

#include "../python_script.h"
#include "../test_util.h"
#include "lockstep/data/dataset.h"
#include "lockstep/export/weights_file.h"
#include "lockstep/infer/predictor.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/torchscript_module.h"
#include "lockstep/models/zoo.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
const std::string kCli = LOCKSTEP_CLI;
const std::string kData = data::kDefaultFashionMnistDir;

TEST(Predict, PercentilesAreByNearestRank) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(exporting::percentile(v, 0.50), 50);
  EXPECT_EQ(exporting::percentile(v, 0.90), 90);
  EXPECT_EQ(exporting::percentile(v, 0.99), 99);
  EXPECT_EQ(exporting::percentile({7.0}, 0.99), 7);
  EXPECT_EQ(exporting::percentile({}, 0.5), 0);
}

TEST(Predict, ConfusionMatrixCountsTrueAgainstPredictedClasses) {
  // A "model" that predicts class (label + 1) % 3 for all but the first sample of each class.
  data::Dataset ds;
  ds.labels = torch::tensor({0, 0, 1, 1, 2, 2}, torch::kLong);
  ds.images = ds.labels.to(torch::kUInt8).reshape({6, 1, 1, 1});
  ds.num_classes = 3;
  ds.mean = 0.0;
  ds.stddev = 1.0 / 255.0;  // the batch's pixels are the labels themselves
  struct ShiftImpl : torch::nn::Module {
    torch::Tensor forward(const torch::Tensor& x) {
      const torch::Tensor label = x.flatten().round().to(torch::kLong);
      torch::Tensor predicted = (label + 1) % 3;
      predicted.index_put_({torch::arange(0, x.size(0), 2)}, label.index({torch::arange(0, x.size(0), 2)}));
      return torch::one_hot(predicted, 3).to(torch::kFloat);
    }
  };
  infer::Predictor predictor(torch::nn::AnyModule(std::make_shared<ShiftImpl>()));
  const auto report = exporting::predict(predictor, ds, exporting::PredictOptions().batch_size(6).warmup(0));
  EXPECT_EQ(report.correct, 3);
  EXPECT_DOUBLE_EQ(report.accuracy(), 0.5);
  const std::vector<std::vector<int64_t>> expected{{1, 1, 0}, {0, 1, 1}, {1, 0, 1}};
  EXPECT_EQ(report.confusion, expected);
  EXPECT_EQ(report.timed_batches, 1);
}

// `lockstep predict --model-file`: a TorchScript classifier scripted in Python predicts on the same
// images as --model does, and its accuracy and confusion are the Predictor's own over the module.
TEST(PredictModelFile, ATorchScriptModuleFromPythonPredictsAsThePredictorDoes) {
  testing::TempDir dir;
  const auto made = testing::run_python_script("torchscript_serving_models.py", dir.path());
  if (!made) GTEST_SKIP() << testing::kNoPythonTorch;
  ASSERT_EQ(made->exit_code, 0) << made->output;
  const std::string file = dir / "image_classifier.pt";
  const auto r = testing::run_command(kCli + " predict --model-file " + file + " --limit 500 --batch-size 50 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(testing::last_json_line(r.output));
  EXPECT_EQ(j["model"], "TorchScript");
  EXPECT_EQ(j["model_file"], file);
  EXPECT_EQ(j["samples"], 500);
  infer::Predictor predictor(torch::nn::AnyModule(models::TorchScriptModule(file)),
                             infer::PredictorOptions().batch_size(50));
  const double expected = predictor.evaluate(data::load_fashion_mnist(kData, data::Split::kTest).take(500));
  std::cout << "[ measured ] predict --model-file accuracy " << j["accuracy"] << ", the Predictor's " << expected << "\n";
  EXPECT_DOUBLE_EQ(j["accuracy"].get<double>(), expected);

  const auto state_dict = testing::run_command(kCli + " predict --model-file " + (dir / "io.json") + " --limit 10");
  EXPECT_NE(state_dict.exit_code, 0);
  EXPECT_THAT(state_dict.output, HasSubstr("'" + (dir / "io.json") + "' is not a TorchScript module"));
  const auto both = testing::run_command(kCli + " predict --model-file " + file + " --weights " + file);
  EXPECT_NE(both.exit_code, 0);
  EXPECT_THAT(both.output, HasSubstr("excludes"));
  const auto neither = testing::run_command(kCli + " predict --limit 10");
  EXPECT_NE(neither.exit_code, 0);
  EXPECT_THAT(neither.output, HasSubstr("give --weights (for --model convnet) or --model-file"));
}

// Issue 53 items 3, 10 and 21: predict --model-file on a module whose output is not a classifier's
// crashed (fewer rows than the batch: rc 139), or scored it (NaN logits, (B, 10, 3): rc 0 with an
// accuracy), or failed naming no file ((B,): "Dimension out of range"). models::check_logits,
// which training uses too, now refuses each naming the file, with exit 2.
TEST(PredictModelFile, AnOutputThatIsNotLogitsIsRefusedNamingTheFile) {
  const testing::PythonFixture made = testing::python_fixture("torchscript_models.py");
  if (made.dir.empty() && made.error.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  ASSERT_TRUE(made.error.empty()) << made.error;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"fewer_rows", "returns shape [49, 10] for a batch of shape [50, 1, 28, 28] of samples 0-49"},
      {"nan", "returns 500 non-finite logits (NaN or inf) of 500"},
      {"three_dims", "returns shape [50, 10, 3]"},
      {"one_dim", "returns shape [50]"}};
  for (const auto& [kind, expected] : cases) {
    const std::string file = made.dir + "/bad_output_" + kind + ".pt";
    const auto r = testing::run_command(kCli + " predict --model-file " + file + " --limit 100 --batch-size 50");
    EXPECT_EQ(r.exit_code, 2) << kind << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr("'" + file + "' " + expected)) << kind;
    if (kind != "nan") EXPECT_THAT(r.output, HasSubstr("a classifier returns logits")) << kind;
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr("accuracy"))) << kind;
  }
  // Training refuses the same files through the same check.
  const auto train = testing::run_command(kCli + " train --quiet --model-file " + made.dir +
                                          "/bad_output_nan.pt --limit 100 --batch-size 50 --ignore-memory-plan");
  EXPECT_NE(train.exit_code, 0) << train.output;
  EXPECT_THAT(train.output, HasSubstr("non-finite logits (NaN or inf)"));
}

// Issue 53 item 8: a 10^4-class model printed a 10^4 x 10^4 confusion matrix (600 MB of stdout).
// The matrix is printed up to 32 classes and kept (JSON) up to 1000.
TEST(Predict, ConfusionMatrixIsBoundedByTheClassCount) {
  data::Dataset ds;
  ds.labels = torch::tensor({0, 1, 2, 3}, torch::kLong);
  ds.images = torch::zeros({4, 1, 1, 1}, torch::kUInt8);
  ds.num_classes = 4;
  ds.mean = 0.0;
  ds.stddev = 1.0;
  struct WideImpl : torch::nn::Module {
    explicit WideImpl(int64_t k) : classes(k) {}
    torch::Tensor forward(const torch::Tensor& x) { return torch::zeros({x.size(0), classes}); }
    int64_t classes;
  };
  for (const int64_t classes : {32, 33, 1000, 10000}) {
    infer::Predictor predictor(torch::nn::AnyModule(std::make_shared<WideImpl>(classes)));
    const auto report = exporting::predict(predictor, ds, exporting::PredictOptions().batch_size(4).warmup(0));
    EXPECT_EQ(report.correct, 1) << classes;  // every sample predicted as class 0
    const std::string text = report.to_text();
    EXPECT_LT(text.size(), 8000u) << classes;
    EXPECT_EQ(report.confusion.size(), classes <= 1000 ? static_cast<size_t>(classes) : 0u) << classes;
    if (classes <= 32) {
      EXPECT_THAT(text, HasSubstr("confusion matrix (rows: true class")) << classes;
    } else {
      EXPECT_THAT(text, HasSubstr("confusion matrix of " + std::to_string(classes) + " classes: not printed (at most 32)"));
      EXPECT_THAT(text, HasSubstr(classes <= 1000 ? "the JSON report has it" : "not kept either (at most 1000 classes)"));
    }
    EXPECT_EQ(report.to_json()["confusion"].is_null(), classes > 1000) << classes;
  }
}

class PredictCli : public ::testing::Test {
 protected:
  // A briefly trained mlp, so that accuracy is far from chance and the confusion matrix is not
  // flat; trained once for the suite.
  static void SetUpTestSuite() {
    weights_dir_ = new testing::TempDir();
    train_output_ = new testing::CommandResult(testing::run_command(
        kCli + " train --quiet --model mlp --limit 2000 --batch-size 50 --save-model " + (*weights_dir_ / "mlp.pt")));
  }
  static void TearDownTestSuite() {
    delete weights_dir_;
    delete train_output_;
  }
  void SetUp() override { ASSERT_EQ(train_output_->exit_code, 0) << train_output_->output; }
  std::string weights() const { return *weights_dir_ / "mlp.pt"; }
  nlohmann::json predict_json(const std::string& args) {
    const auto r = testing::run_command(kCli + " predict --model mlp --weights " + weights() + " --json " + args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(testing::last_json_line(r.output));
  }
  testing::TempDir dir_;
  static testing::TempDir* weights_dir_;
  static testing::CommandResult* train_output_;
};
testing::TempDir* PredictCli::weights_dir_ = nullptr;
testing::CommandResult* PredictCli::train_output_ = nullptr;

TEST_F(PredictCli, AccuracyAndConfusionMatrixAgreeWithThePredictorsEvaluation) {
  const auto j = predict_json("--limit 1000 --batch-size 64");
  auto model = models::make_model("mlp");
  models::load_state_dict_file(*model, weights());
  // The same batches as predict's, so that every sample sees the same arithmetic.
  infer::Predictor predictor(torch::nn::AnyModule(model), infer::PredictorOptions().batch_size(64));
  const double expected = predictor.evaluate(data::load_fashion_mnist(kData, data::Split::kTest).take(1000));
  EXPECT_GT(expected, 0.5);
  EXPECT_DOUBLE_EQ(j["accuracy"].get<double>(), expected);
  EXPECT_EQ(j["samples"], 1000);
  int64_t total = 0, diagonal = 0;
  const auto confusion = j["confusion"].get<std::vector<std::vector<int64_t>>>();
  ASSERT_EQ(confusion.size(), 10u);
  for (size_t t = 0; t < confusion.size(); ++t)
    for (size_t c = 0; c < confusion[t].size(); ++c) {
      total += confusion[t][c];
      diagonal += t == c ? confusion[t][c] : 0;
    }
  EXPECT_EQ(total, 1000);
  EXPECT_EQ(diagonal, j["correct"].get<int64_t>());
  // 1000 / 64: 15 full batches, 2 of them warmup.
  EXPECT_EQ(j["latency_ms"]["timed_batches"], 13);
  const double p50 = j["latency_ms"]["p50"], p90 = j["latency_ms"]["p90"], p99 = j["latency_ms"]["p99"];
  EXPECT_GT(p50, 0);
  EXPECT_LE(p50, p90);
  EXPECT_LE(p90, p99);
  EXPECT_GT(j["throughput_samples_per_s"].get<double>(), 0);
}

TEST_F(PredictCli, Bf16AgreesWithFp32OnAlmostEverySample) {
  const auto fp32 = predict_json("--limit 1000");
  const auto bf16 = predict_json("--limit 1000 --precision bf16");
  EXPECT_EQ(bf16["precision"], "bf16");
  EXPECT_NEAR(bf16["accuracy"].get<double>(), fp32["accuracy"].get<double>(), 0.02);
}

TEST_F(PredictCli, ReadsIdxAndRawImageFilesAsTheSplitItself) {
  const auto split = predict_json("--limit 300");
  // IDX, gzipped, as distributed.
  const auto idx = predict_json("--limit 300 --images " + kData + "/t10k-images-idx3-ubyte.gz --labels " + kData +
                                "/t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(idx["confusion"], split["confusion"]);
  // Raw bytes: the same 300 images and labels.
  const auto test = data::load_fashion_mnist(kData, data::Split::kTest).take(300);
  std::ofstream(dir_ / "images.raw", std::ios::binary)
      .write(static_cast<const char*>(test.images.contiguous().data_ptr()), test.images.numel());
  const torch::Tensor labels = test.labels.to(torch::kUInt8).contiguous();
  std::ofstream(dir_ / "labels.raw", std::ios::binary).write(static_cast<const char*>(labels.data_ptr()), 300);
  const auto raw = predict_json("--images " + (dir_ / "images.raw") + " --labels " + (dir_ / "labels.raw"));
  EXPECT_EQ(raw["confusion"], split["confusion"]);
  // Without labels: the predictions, whose class counts are the confusion matrix's column sums.
  const auto unlabelled = predict_json("--images " + (dir_ / "images.raw"));
  EXPECT_FALSE(unlabelled.contains("accuracy"));
  ASSERT_EQ(unlabelled["predictions"].size(), 300u);
  EXPECT_EQ(unlabelled["predicted_counts"], split["predicted_counts"]);
}

// Files that are not what predict reads are refused naming them (issue 29): a label that is not one
// of the model's classes (it made a 256-class confusion matrix), an IDX file of floats (its bytes
// were read as pixels).
// predict runs image models on image data; a text source is refused, not read as Fashion-MNIST.
TEST_F(PredictCli, ATextDataSourceIsRefused) {
  const auto r = testing::run_command(kCli + " predict --model mlp --weights " + weights() + " --data fortunes");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--data: fortunes not in {fashion-mnist,synthetic}"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("accuracy")));
}

TEST_F(PredictCli, LabelsOutsideTheModelsClassesAndFloatIdxImagesAreRefused) {
  const auto test = data::load_fashion_mnist(kData, data::Split::kTest).take(300);
  std::ofstream(dir_ / "images.raw", std::ios::binary)
      .write(static_cast<const char*>(test.images.contiguous().data_ptr()), test.images.numel());
  torch::Tensor labels = test.labels.to(torch::kUInt8).contiguous();
  labels[3] = 255;
  std::ofstream(dir_ / "labels.raw", std::ios::binary).write(static_cast<const char*>(labels.data_ptr()), 300);
  const auto r = testing::run_command(kCli + " predict --model mlp --weights " + weights() + " --images " +
                                      (dir_ / "images.raw") + " --labels " + (dir_ / "labels.raw"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("holds label 255 at index 3 (1 label(s) in all) but the model has 10 classes "
                                  "(0 to 9)"));
  {  // IDX header: 0, 0, type 0x0D (float32), 3 dimensions; then 2 x 28 x 28, big-endian; then the floats.
    std::ofstream idx(dir_ / "floats.idx", std::ios::binary);
    const unsigned char head[] = {0, 0, 0x0D, 3, 0, 0, 0, 2, 0, 0, 0, 28, 0, 0, 0, 28};
    idx.write(reinterpret_cast<const char*>(head), sizeof(head));
    const std::vector<char> values(2 * 28 * 28 * 4, 0);
    idx.write(values.data(), static_cast<std::streamsize>(values.size()));
  }
  const auto floats = testing::run_command(kCli + " predict --model mlp --weights " + weights() + " --images " +
                                           (dir_ / "floats.idx"));
  EXPECT_NE(floats.exit_code, 0) << floats.output;
  EXPECT_THAT(floats.output, HasSubstr("is an IDX file of float32 values; images and labels are read as uint8"));
}

TEST_F(PredictCli, PrintsAReportForAPerson) {
  const auto r = testing::run_command(kCli + " predict --model mlp --weights " + weights() + " --limit 500");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("accuracy 0."));
  EXPECT_THAT(r.output, HasSubstr("confusion matrix (rows: true class, columns: predicted class)"));
  EXPECT_THAT(r.output, HasSubstr("p99"));
  EXPECT_THAT(r.output, HasSubstr("samples/s"));
}

TEST_F(PredictCli, RejectsImagesOfTheWrongSizeNamingTheFile) {
  std::ofstream(dir_ / "odd.raw", std::ios::binary) << std::string(1000, 'a');
  const auto r = testing::run_command(kCli + " predict --model mlp --weights " + weights() + " --images " +
                                      (dir_ / "odd.raw"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("odd.raw' holds 1000 pixels, not a whole number of images"));
}

}  // namespace
}  // namespace lockstep
