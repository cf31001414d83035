#include "lockstep/infer/predictor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../dist/multi_rank.h"
#include "../test_util.h"
#include "lockstep/models/convnet.h"
#include "lockstep/train/evaluate.h"

namespace lockstep::infer {
namespace {

using ::testing::HasSubstr;

// A convnet whose BatchNorm has running statistics unlike a batch's own, so eval mode shows.
std::shared_ptr<models::ConvNetImpl> trained_convnet() {
  torch::manual_seed(2);
  auto model = std::make_shared<models::ConvNetImpl>();
  for (int i = 0; i < 3; ++i) model->forward(torch::randn({8, 1, 28, 28}) * 3 + 1);  // moves running stats
  return model;
}

TEST(Predictor, ForwardIsTheEvalModeForwardWithoutAutograd) {
  auto model = trained_convnet();
  const torch::Tensor x = torch::randn({5, 1, 28, 28});
  Predictor predictor{torch::nn::AnyModule(model)};
  const torch::Tensor logits = predictor.forward(x);
  EXPECT_FALSE(model->is_training());
  EXPECT_FALSE(logits.requires_grad());
  model->eval();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(logits, model->forward(x)));
  EXPECT_TRUE(torch::equal(predictor.predict(x), model->forward(x).argmax(1)));
  model->train();
  EXPECT_FALSE(torch::allclose(logits, model->forward(x), 1e-3, 1e-3)) << "batch statistics would differ";
}

// See Note [Channels-last weights for inference]: the convolution weights change layout, not value,
// and the logits stay those of the NCHW model (oneDNN's NHWC kernels sum in another order: 1e-5).
// layer2 (16 input channels): a (16, 1, 5, 5) weight is channels-last and contiguous at once.
TEST(Predictor, ChannelsLastWeightsKeepTheirValuesAndTheLogits) {
  auto model = trained_convnet();
  const torch::Tensor x = torch::randn({7, 1, 28, 28});
  const torch::Tensor conv_weight = model->layer2[0]->as<torch::nn::Conv2d>()->weight;
  const torch::Tensor before = conv_weight.clone();
  const torch::Tensor nchw = Predictor(torch::nn::AnyModule(model), PredictorOptions().channels_last(false)).forward(x);
  EXPECT_TRUE(conv_weight.is_contiguous()) << "channels_last(false) must leave the layout alone";

  const torch::Tensor channels_last = Predictor(torch::nn::AnyModule(model)).forward(x);
  const torch::Tensor weight = model->layer2[0]->as<torch::nn::Conv2d>()->weight;
  EXPECT_TRUE(weight.is_contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_FALSE(weight.is_contiguous());
  EXPECT_TRUE(torch::equal(weight, before));
  EXPECT_LE((channels_last - nchw).abs().max().item<double>(), 1e-5);
  for (const torch::Tensor& p : model->parameters())
    if (p.dim() != 4) EXPECT_TRUE(p.is_contiguous()) << "only 4-D weights change layout";
}

// bf16 autocast: fp32 logits close to fp32's (bf16 keeps 8 bits of mantissa: 2e-2 relative).
TEST(Predictor, Bf16AutocastStaysCloseToFp32AndReturnsFp32) {
  auto model = trained_convnet();
  const torch::Tensor x = torch::randn({6, 1, 28, 28});
  const torch::Tensor fp32 = Predictor(torch::nn::AnyModule(model)).forward(x);
  const torch::Tensor bf16 = Predictor(torch::nn::AnyModule(model), PredictorOptions().autocast(torch::kBFloat16)).forward(x);
  EXPECT_EQ(bf16.scalar_type(), torch::kFloat);
  EXPECT_FALSE(torch::equal(fp32, bf16)) << "autocast did nothing";
  EXPECT_LE((fp32 - bf16).abs().max().item<double>(), 2e-2 * fp32.abs().max().item<double>() + 1e-2);
}

// Accuracy by hand against Predictor::evaluate, on one process and split over 2 ranks.
TEST(Predictor, EvaluateCountsCorrectPredictionsOnOneOrManyRanks) {
  auto model = trained_convnet();
  torch::manual_seed(7);
  data::Dataset ds;
  ds.images = torch::randint(0, 256, {450, 1, 28, 28}, torch::kUInt8);
  ds.labels = torch::randint(0, 10, {450}, torch::kInt64);
  ds.num_classes = 10;
  Predictor predictor(torch::nn::AnyModule(model), PredictorOptions().batch_size(64));
  auto [x, y] = ds.batch(torch::arange(450, torch::kInt64));
  const double expected = predictor.predict(x).eq(y).sum().item<double>() / 450.0;
  EXPECT_DOUBLE_EQ(predictor.evaluate(ds), expected);
  std::vector<double> per_rank(2);
  testing::run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    Predictor p(torch::nn::AnyModule(model), PredictorOptions().batch_size(64));
    per_rank[rank] = p.evaluate(ds, &group);
  });
  EXPECT_DOUBLE_EQ(per_rank[0], expected);
  EXPECT_DOUBLE_EQ(per_rank[1], expected);
}

TEST(Predictor, RejectsBadOptionsAndEmptyData) {
  auto model = trained_convnet();
  EXPECT_THAT(testing::error_message([&] { Predictor(torch::nn::AnyModule(model), PredictorOptions().batch_size(0)); }),
              HasSubstr("batch size 0 must be at least 1"));
  EXPECT_THAT(testing::error_message([&] { Predictor(torch::nn::AnyModule(model), PredictorOptions().autocast(torch::kInt)); }),
              HasSubstr("autocast dtype must be kBFloat16 or kHalf"));
  data::Dataset empty;
  empty.images = torch::zeros({0, 1, 28, 28}, torch::kUInt8);
  empty.labels = torch::zeros({0}, torch::kInt64);
  EXPECT_THAT(testing::error_message([&] { Predictor(torch::nn::AnyModule(model)).evaluate(empty); }),
              HasSubstr("cannot evaluate on an empty data set"));
}

}  // namespace
}  // namespace lockstep::infer
