#include "lockstep/train/trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include "../test_util.h"

namespace lockstep::train {
namespace {

using ::testing::HasSubstr;

bool have_fashion_mnist() {
  return ::access((std::string(data::kDefaultFashionMnistDir) + "/train-images-idx3-ubyte.gz").c_str(), R_OK) == 0;
}

TrainOptions small_run() {
  return TrainOptions().model("convnet").limit(1200).batch_size(100).epochs(2).progress(false);
}

TEST(Trainer, SameSeedGivesBitIdenticalLossSequence) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TrainResult a = train(small_run().seed(11));
  TrainResult b = train(small_run().seed(11));
  TrainResult c = train(small_run().seed(12));
  ASSERT_EQ(a.step_losses.size(), 24u);  // 2 epochs x 1200 / 100
  EXPECT_EQ(a.step_losses, b.step_losses);  // exact, not approximate
  EXPECT_NE(a.step_losses, c.step_losses);
  EXPECT_EQ(a.test_acc, b.test_acc);
}

TEST(Trainer, ConvNetLearnsFashionMnist) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TrainResult r = train(TrainOptions().limit(6000).epochs(1).progress(false));
  // Chance is 0.10; the first 6000 samples for one epoch reach about 0.78 (0.70 leaves room).
  EXPECT_GT(r.test_acc, 0.70);
  EXPECT_LT(r.step_losses.back(), r.step_losses.front());
  EXPECT_EQ(r.samples, 6000);
  EXPECT_GT(r.samples_per_s, 0);
  EXPECT_GT(r.peak_rss_mib, 0);
}

TEST(Trainer, SyntheticDataTrainsResNet18Shapes) {
  TrainResult r = train(TrainOptions().model("resnet18").data("synthetic").limit(8).batch_size(4)
                            .progress(false));
  EXPECT_EQ(r.step_losses.size(), 2u);
  for (double l : r.step_losses) EXPECT_TRUE(std::isfinite(l));
}

TEST(Trainer, SummaryJsonHasTheDocumentedKeysInOrder) {
  TrainResult r;
  r.world_size = 1;
  r.samples_per_s = 1234.56;
  r.train_s = 1.5;
  r.test_acc = 0.891234;
  r.final_loss = 0.25;
  r.peak_rss_mib = 300.04;
  EXPECT_EQ(r.summary_json(),
            R"({"world_size":1,"samples_per_s":1234.6,"train_s":1.5,"test_acc":0.8912,)"
            R"("final_loss":0.25,"peak_rss_mib":300.0})");
}

TEST(Trainer, RejectsBadOptionsNamingTheValue) {
  auto msg = [](const TrainOptions& o) { return testing::error_message([&] { o.validate(); }); };
  EXPECT_THAT(msg(TrainOptions().batch_size(0)), HasSubstr("batch size 0"));
  EXPECT_THAT(msg(TrainOptions().lr(-0.1)), HasSubstr("learning rate -0.1"));
  EXPECT_THAT(msg(TrainOptions().model("lenet")), HasSubstr("unknown model 'lenet'"));
  EXPECT_THAT(msg(TrainOptions().data("cifar")), HasSubstr("unknown data 'cifar'"));
  EXPECT_THAT(msg(TrainOptions().epochs(0)), HasSubstr("epochs=0"));
  EXPECT_EQ(msg(TrainOptions()), "<no error>");
}

TEST(Trainer, ResNetOnFashionMnistSuggestsSynthetic) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  EXPECT_THAT(testing::error_message([] { train(TrainOptions().model("resnet18").progress(false)); }),
              HasSubstr("--data synthetic"));
}

}  // namespace
}  // namespace lockstep::train
