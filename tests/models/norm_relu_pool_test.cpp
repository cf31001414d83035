#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <optional>
#include <string>

#include "../../src/models/norm_relu_pool.h"

namespace lockstep::models {
namespace {

namespace nn = torch::nn;

// The largest difference, relative to the largest value of `want` (or absolute below 1).
double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).abs().max().item<double>() / std::max(1.0, want.abs().max().item<double>());
}

struct Case {
  std::string name;
  nn::BatchNorm2dOptions options;
  std::vector<int64_t> shape;  // (N, C, H, W)
  bool ties = false;           // inputs on a coarse grid, so windows hold equal values
};

// Two BatchNorm2d with the same non-default weights (some negative, so the largest normalised
// value is not always the largest input) and running statistics.
std::pair<nn::BatchNorm2d, nn::BatchNorm2d> twins(const nn::BatchNorm2dOptions& options) {
  nn::BatchNorm2d a(options), b(options);
  torch::NoGradGuard no_grad;
  const int64_t c = options.num_features();
  if (a->weight.defined()) {
    a->weight.copy_(torch::randn({c}));
    a->bias.copy_(torch::randn({c}));
  }
  if (a->running_mean.defined()) {
    a->running_mean.copy_(torch::randn({c}));
    a->running_var.copy_(torch::rand({c}) + 0.5);
  }
  for (size_t i = 0; i < a->parameters().size(); ++i) b->parameters()[i].copy_(a->parameters()[i]);
  for (size_t i = 0; i < a->buffers().size(); ++i) b->buffers()[i].copy_(a->buffers()[i]);
  return {a, b};
}

// Against LibTorch's BatchNorm2d, ReLU and MaxPool2d(2) in train mode, over two steps (so the
// running statistics' second update starts from the first's): the output, the gradients of the
// input, weight and bias, and every buffer. Within 1e-5 relative: the same sums in another order.
TEST(NormReluPool, EqualsLibTorchsBatchNormReluAndMaxPoolInTraining) {
  torch::manual_seed(11);
  const std::vector<Case> cases = {
      {"affine, momentum 0.1", nn::BatchNorm2dOptions(16), {20, 16, 28, 28}},
      {"cumulative average", nn::BatchNorm2dOptions(8).momentum(c10::nullopt).eps(1e-3), {3, 8, 14, 6}},
      {"no affine", nn::BatchNorm2dOptions(5).affine(false), {4, 5, 8, 8}},
      {"no running statistics", nn::BatchNorm2dOptions(6).track_running_stats(false), {2, 6, 10, 12}},
      {"ties in the windows", nn::BatchNorm2dOptions(4), {6, 4, 12, 12}, true},
      {"one image of 2x2", nn::BatchNorm2dOptions(3), {1, 3, 2, 2}},
      {"rows of 17 windows: two whole chunks and one window", nn::BatchNorm2dOptions(4), {2, 4, 6, 34}},
      {"rows of exactly 8 windows", nn::BatchNorm2dOptions(3), {3, 3, 4, 16}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto [libtorch, ours] = twins(c.options);
    ASSERT_TRUE(norm_relu_pool_trains(*ours, torch::zeros(c.shape)));
    for (int step = 0; step < 2; ++step) {
      torch::Tensor x = torch::randn(c.shape) * 3 + 1.5;
      if (c.ties) x = (x * 2).round() / 2;
      const torch::Tensor x1 = x.clone().requires_grad_(), x2 = x.clone().requires_grad_();
      const torch::Tensor want = torch::max_pool2d(torch::relu(libtorch->forward(x1)), {2, 2});
      const torch::Tensor got = norm_relu_pool_train(*ours, x2);
      ASSERT_EQ(got.sizes(), want.sizes());
      EXPECT_LE(relative_error(got, want), 1e-5) << "step " << step;
      const torch::Tensor g = torch::randn(want.sizes());
      want.backward(g);
      got.backward(g);
      EXPECT_LE(relative_error(x2.grad(), x1.grad()), 1e-5) << "step " << step;
      for (size_t i = 0; i < ours->parameters().size(); ++i)
        EXPECT_LE(relative_error(ours->parameters()[i].grad(), libtorch->parameters()[i].grad()), 1e-5)
            << "parameter " << i << ", step " << step;
      for (size_t i = 0; i < ours->buffers().size(); ++i)
        EXPECT_LE(relative_error(ours->buffers()[i], libtorch->buffers()[i]), 1e-6)
            << "buffer " << i << ", step " << step;
    }
  }
}

// Under autocast the convolution gives bf16: the same against LibTorch's modules on bf16 input (fp32
// parameters and statistics), output and input gradient in bf16, parameter gradients in fp32. The
// norm of the difference within 1e-2 of the norm (bf16 keeps 8 bits; a value LibTorch and this
// round to neighbouring bf16 may pick another window winner, so not the largest difference).
TEST(NormReluPool, TakesAutocastsBFloat16AsLibTorchsModulesDo) {
  torch::manual_seed(14);
  const auto norm_error = [](const torch::Tensor& got, const torch::Tensor& want) {
    return ((got.to(torch::kDouble) - want.to(torch::kDouble)).norm() / want.to(torch::kDouble).norm()).item<double>();
  };
  // Rows of 7 windows (the convnet's second block: each a part of a chunk), and of 17 (two whole chunks and one).
  for (const std::vector<int64_t> shape : {std::vector<int64_t>{8, 16, 14, 14}, std::vector<int64_t>{4, 16, 6, 34}}) {
    SCOPED_TRACE(c10::str(shape));
    auto [libtorch, ours] = twins(nn::BatchNorm2dOptions(16));
    const torch::Tensor x = (torch::randn(shape) * 3 + 1).to(torch::kBFloat16);
    ASSERT_TRUE(norm_relu_pool_trains(*ours, x));
    const torch::Tensor x1 = x.clone().requires_grad_(), x2 = x.clone().requires_grad_();
    const torch::Tensor want = torch::max_pool2d(torch::relu(libtorch->forward(x1)), {2, 2});
    const torch::Tensor got = norm_relu_pool_train(*ours, x2);
    ASSERT_EQ(got.scalar_type(), torch::kBFloat16);
    EXPECT_LE(norm_error(got, want), 1e-2);
    // Each output LibTorch's bf16 value or its neighbour (8 bits: 2^-7 relative at most).
    const torch::Tensor a = got.to(torch::kDouble), b = want.to(torch::kDouble);
    EXPECT_LE(((a - b).abs() / b.abs().clamp_min(1e-30)).masked_fill(b == 0, 0).max().item<double>(), 1.0 / 128);
    EXPECT_TRUE(torch::equal(a == 0, b == 0));
    const torch::Tensor g = torch::randn(want.sizes()).to(torch::kBFloat16);
    want.backward(g);
    got.backward(g);
    ASSERT_EQ(x2.grad().scalar_type(), torch::kBFloat16);
    EXPECT_LE(norm_error(x2.grad(), x1.grad()), 1e-2);
    for (size_t i = 0; i < ours->parameters().size(); ++i) {
      ASSERT_EQ(ours->parameters()[i].grad().scalar_type(), torch::kFloat);
      EXPECT_LE(norm_error(ours->parameters()[i].grad(), libtorch->parameters()[i].grad()), 1e-2) << "parameter " << i;
    }
    EXPECT_LE(relative_error(ours->running_var, libtorch->running_var), 1e-5);
  }
}

// Checkpointing's first forward runs in train mode without autograd: the same values, and the
// running statistics updated once, as LibTorch's modules do.
TEST(NormReluPool, WithoutAutogradGivesTheSameOutputAndUpdatesTheStatisticsOnce) {
  torch::manual_seed(12);
  auto [with, without] = twins(nn::BatchNorm2dOptions(8));
  const torch::Tensor x = torch::randn({5, 8, 12, 12}) - 2;
  const torch::Tensor a = norm_relu_pool_train(*with, x.clone().requires_grad_());
  torch::Tensor b;
  {
    torch::NoGradGuard no_grad;
    b = norm_relu_pool_train(*without, x);
  }
  EXPECT_TRUE(a.requires_grad());
  EXPECT_FALSE(b.requires_grad());
  EXPECT_TRUE(torch::equal(a.detach(), b));
  EXPECT_EQ(without->num_batches_tracked.item<int64_t>(), 1);
  EXPECT_TRUE(torch::equal(with->running_var, without->running_var));
}

// A NaN reaches the output and the gradient where LibTorch's modules put it: its window's output,
// its channel's statistics (so every output of the channel), nothing of the other channels.
TEST(NormReluPool, ANanSpoilsItsChannelAsInLibTorch) {
  torch::manual_seed(13);
  auto [libtorch, ours] = twins(nn::BatchNorm2dOptions(3));
  torch::Tensor x = torch::randn({2, 3, 4, 4});
  x[1][2][3][0] = std::numeric_limits<float>::quiet_NaN();
  const torch::Tensor want = torch::max_pool2d(torch::relu(libtorch->forward(x)), {2, 2});
  const torch::Tensor got = norm_relu_pool_train(*ours, x);
  EXPECT_TRUE(torch::equal(got.isnan(), want.isnan()));
  EXPECT_TRUE(got.select(1, 2).isnan().all().item<bool>());
  EXPECT_FALSE(got.narrow(1, 0, 2).isnan().any().item<bool>());
}

// What the function does not take runs LibTorch's modules (convnet.cpp asks first).
TEST(NormReluPool, TakesOnlyWhatItComputesAsLibTorchDoes) {
  nn::BatchNorm2d norm(4);
  const torch::Tensor x = torch::randn({2, 4, 6, 6});
  EXPECT_TRUE(norm_relu_pool_trains(*norm, x));
  EXPECT_FALSE(norm_relu_pool_trains(*norm, torch::randn({2, 4, 7, 6})));  // odd height
  EXPECT_FALSE(norm_relu_pool_trains(*norm, x.to(torch::kDouble)));
  EXPECT_TRUE(norm_relu_pool_trains(*norm, x.to(torch::kBFloat16)));
  EXPECT_FALSE(norm_relu_pool_trains(*norm, x.contiguous(torch::MemoryFormat::ChannelsLast)));
  EXPECT_FALSE(norm_relu_pool_trains(*norm, torch::randn({2, 5, 6, 6})));  // channels != num_features
  norm->eval();
  EXPECT_FALSE(norm_relu_pool_trains(*norm, x));
  // Another subclass keeps its own forward (SyncBatchNorm: tests/parallel/sync_batch_norm_test.cpp).
  struct OwnNorm : nn::BatchNorm2dImpl {
    using nn::BatchNorm2dImpl::BatchNorm2dImpl;
  };
  EXPECT_FALSE(norm_relu_pool_trains(OwnNorm(4), x));
}

}  // namespace
}  // namespace lockstep::models
