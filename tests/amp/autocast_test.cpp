#include "lockstep/amp/autocast.h"

#include <ATen/autocast_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../test_util.h"

namespace lockstep::amp {
namespace {

using ::testing::HasSubstr;

// The thread's autocast nesting depth (LibTorch has no getter; this probe leaves it unchanged).
int nesting() {
  const int depth = at::autocast::increment_nesting() - 1;
  at::autocast::decrement_nesting();
  return depth;
}

TEST(AutocastGuard, LinearMatmulConvRunInBf16AndLossInFp32) {
  torch::nn::Linear linear(4, 3);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(1, 2, 3));
  const auto x = torch::randn({2, 4});
  AutocastGuard autocast;
  const auto logits = linear->forward(x);
  EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(torch::matmul(x, x.t()).scalar_type(), torch::kBFloat16);
  EXPECT_EQ(conv->forward(torch::randn({1, 1, 5, 5})).scalar_type(), torch::kBFloat16);
  // Losses are on the fp32 list, as in Python.
  EXPECT_EQ(torch::nn::functional::cross_entropy(logits, torch::tensor({0, 2})).scalar_type(), torch::kFloat);
}

TEST(AutocastGuard, InnerDisabledGuardRunsInFullPrecision) {
  torch::nn::Linear linear(4, 3);
  const auto x = torch::randn({2, 4});
  AutocastGuard outer;
  {
    AutocastGuard inner(torch::kCPU, torch::kBFloat16, /*enabled=*/false);
    EXPECT_FALSE(autocast_enabled());
    EXPECT_EQ(linear->forward(x).scalar_type(), torch::kFloat);
  }
  EXPECT_TRUE(autocast_enabled());
  EXPECT_EQ(linear->forward(x).scalar_type(), torch::kBFloat16);
}

TEST(AutocastGuard, ExitRestoresFlagDtypeAndNesting) {
  ASSERT_FALSE(autocast_enabled());
  ASSERT_EQ(nesting(), 0);
  const torch::ScalarType before = autocast_dtype();
  {
    AutocastGuard outer;
    EXPECT_EQ(nesting(), 1);
    {
      AutocastGuard inner(torch::kCPU, torch::kBFloat16, false);
      EXPECT_EQ(nesting(), 2);
    }
    EXPECT_TRUE(autocast_enabled());
    EXPECT_EQ(nesting(), 1);
  }
  EXPECT_FALSE(autocast_enabled());
  EXPECT_EQ(autocast_dtype(), before);
  EXPECT_EQ(nesting(), 0);
  EXPECT_EQ(torch::nn::Linear(4, 3)->forward(torch::randn({2, 4})).scalar_type(), torch::kFloat);
}

// See Note [Autocast weight cache]. y = w x with w and x all ones, so y = 4 * w. torch::linear on
// the weight itself: LibTorch's nn::Linear passes weight.t(), a view, which autocast never caches.
TEST(AutocastGuard, WeightCacheLivesUntilTheOutermostGuardExits) {
  const auto weight = torch::ones({1, 4}).requires_grad_();
  const auto x = torch::ones({1, 4});
  auto set_weight = [&](float value) {
    torch::NoGradGuard no_grad;
    weight.fill_(value);
  };
  {
    AutocastGuard outer;
    EXPECT_EQ(torch::linear(x, weight).item<float>(), 4);
    { AutocastGuard inner; }  // an inner exit keeps the cache
    set_weight(2);
    EXPECT_EQ(torch::linear(x, weight).item<float>(), 4) << "the cached bf16 copy of the old weight is used";
  }
  {
    AutocastGuard next;
    EXPECT_EQ(torch::linear(x, weight).item<float>(), 8) << "the outermost exit must clear the cache";
  }
}

// LibTorch 2.x's CPU autocast runs fp16 as well as bf16, as Python's torch.autocast("cpu", torch.float16).
TEST(AutocastGuard, Fp16OnCpuCastsLinearToHalf) {
  const torch::Tensor x = torch::randn({2, 4}), weight = torch::randn({3, 4});
  AutocastGuard guard(torch::kCPU, torch::kHalf);
  EXPECT_EQ(autocast_dtype(), torch::kHalf);
  EXPECT_EQ(torch::linear(x, weight).scalar_type(), torch::kHalf);
}

TEST(AutocastGuard, ADtypeThatIsNotHalfPrecisionIsAnErrorNamingIt) {
  const std::string msg = testing::error_message([] { AutocastGuard guard(torch::kCPU, torch::kDouble); });
  EXPECT_THAT(msg, HasSubstr("does not support dtype Double"));
  EXPECT_THAT(msg, HasSubstr("torch::kBFloat16 or torch::kHalf"));
  EXPECT_FALSE(autocast_enabled());
  EXPECT_EQ(nesting(), 0);
  // Disabled, the dtype is not used, so it is not checked.
  AutocastGuard off(torch::kCPU, torch::kDouble, false);
}

}  // namespace
}  // namespace lockstep::amp
