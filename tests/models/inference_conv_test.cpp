#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>
#include <vector>

#include "../../src/models/inference_conv.h"

namespace lockstep::models {
namespace {

namespace nn = torch::nn;

// A convolution and an eval-mode BatchNorm whose statistics and affine terms are not the defaults,
// so that folding them into the weights changes every value.
struct Pair {
  nn::Conv2d conv;
  nn::BatchNorm2d norm;
  Pair(nn::Conv2dOptions conv_options, nn::BatchNorm2dOptions norm_options)
      : conv(conv_options), norm(norm_options) {
    torch::NoGradGuard no_grad;
    const int64_t c = norm_options.num_features();
    if (norm->running_mean.defined()) {
      norm->running_mean.copy_(torch::rand({c}) - 0.5);
      norm->running_var.copy_(torch::rand({c}) * 2 + 0.1);
    }
    if (norm->weight.defined()) {
      norm->weight.copy_(torch::rand({c}) + 0.5);
      norm->bias.copy_(torch::rand({c}) - 0.5);
    }
    norm->eval();
  }
  torch::Tensor libtorch(const torch::Tensor& x) { return norm->forward(conv->forward(x)); }
};

// The largest difference against LibTorch, relative to the largest value LibTorch gives.
double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
}

TEST(InferenceConv, EqualsLibTorchsConvolutionAndEvalBatchNorm) {
  torch::manual_seed(1);
  torch::NoGradGuard no_grad;
  std::vector<Pair> pairs;
  pairs.emplace_back(nn::Conv2dOptions(1, 16, 5).padding(2), nn::BatchNorm2dOptions(16));
  pairs.emplace_back(nn::Conv2dOptions(3, 8, 3).padding({1, 0}).stride({2, 1}).bias(false), nn::BatchNorm2dOptions(8));
  pairs.emplace_back(nn::Conv2dOptions(4, 6, {3, 2}).dilation(2), nn::BatchNorm2dOptions(6).affine(false));
  for (size_t i = 0; i < pairs.size(); ++i) {
    Pair& p = pairs[i];
    const int64_t in = p.conv->options.in_channels();
    for (const int64_t batch : {1, 5, 2}) {
      for (const bool channels_last : {false, true}) {
        torch::Tensor x = torch::randn({batch, in, 13, 11});
        if (channels_last) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
        InferenceConv inference;
        ASSERT_TRUE(InferenceConv::supports(*p.conv, *p.norm, x)) << "pair " << i;
        const torch::Tensor got = inference.forward(*p.conv, *p.norm, x);
        const torch::Tensor want = p.libtorch(x);
        ASSERT_EQ(got.sizes(), want.sizes()) << "pair " << i;
        EXPECT_TRUE(got.is_contiguous(torch::MemoryFormat::ChannelsLast));
        EXPECT_LE(relative_error(got, want), 1e-5) << "pair " << i << " batch " << batch;
      }
    }
  }
}

// The folded weights follow the module's tensors: an in-place update (as an optimizer step makes),
// new BatchNorm statistics (a train-mode forward's do not bump the tensors' version counters), a
// write through .data() and a tensor given new storage (set_data) each show in the next call.
TEST(InferenceConv, FollowsTheModulesTensorsWhenTheyChange) {
  torch::manual_seed(2);
  torch::NoGradGuard no_grad;
  Pair p(nn::Conv2dOptions(3, 8, 3).padding(1), nn::BatchNorm2dOptions(8));
  InferenceConv inference;
  // Two batch sizes: after a change the first call (y's) folds again, and x's, after it, must use
  // the new weights too.
  const torch::Tensor x = torch::randn({2, 3, 9, 9}), y = torch::randn({3, 3, 9, 9});
  EXPECT_LE(relative_error(inference.forward(*p.conv, *p.norm, x), p.libtorch(x)), 1e-5);
  EXPECT_LE(relative_error(inference.forward(*p.conv, *p.norm, y), p.libtorch(y)), 1e-5);
  const std::vector<std::pair<const char*, std::function<void()>>> changes{
      {"weight.add_", [&] { p.conv->weight.add_(0.25); }},
      {"bias.mul_", [&] { p.conv->bias.mul_(-3); }},
      {"running_var.copy_", [&] { p.norm->running_var.copy_(torch::rand({8}) + 2); }},
      {"a train-mode forward's running statistics",
       [&] {
         p.norm->train();
         p.norm->forward(torch::randn({4, 8, 5, 5}) * 3 + 1);
         p.norm->eval();
       }},
      {"weight.data().mul_", [&] { p.conv->weight.data().mul_(2); }},
      {"norm.weight.set_data", [&] { p.norm->weight.set_data(torch::rand({8}) * 4); }},
      {"weight.set_data channels-last",
       [&] { p.conv->weight.set_data(torch::randn({8, 3, 3, 3}).contiguous(torch::MemoryFormat::ChannelsLast)); }},
  };
  for (const auto& [name, change] : changes) {
    const torch::Tensor before = p.libtorch(x);
    change();
    const torch::Tensor want = p.libtorch(x);
    ASSERT_GT((want - before).abs().max().item<double>(), 1e-3) << name << " changed nothing";
    EXPECT_LE(relative_error(inference.forward(*p.conv, *p.norm, y), p.libtorch(y)), 1e-5) << "after " << name;
    EXPECT_LE(relative_error(inference.forward(*p.conv, *p.norm, x), want), 1e-5) << "after " << name;
  }
}

// Calls from several threads at once, each with its own batch size, as the server's instances make.
TEST(InferenceConv, ManyThreadsAtOnceGetTheirOwnResults) {
  torch::manual_seed(3);
  torch::NoGradGuard no_grad;
  Pair p(nn::Conv2dOptions(4, 8, 3).padding(1), nn::BatchNorm2dOptions(8));
  InferenceConv inference;
  std::vector<torch::Tensor> inputs, wants;
  for (int64_t t = 0; t < 4; ++t) {
    inputs.push_back(torch::randn({1 + t, 4, 10, 10}));
    wants.push_back(p.libtorch(inputs.back()));
  }
  std::vector<double> errors(inputs.size(), 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < inputs.size(); ++t)
    threads.emplace_back([&, t] {
      torch::NoGradGuard guard;
      for (int round = 0; round < 20; ++round)
        errors[t] = std::max(errors[t], relative_error(inference.forward(*p.conv, *p.norm, inputs[t]), wants[t]));
    });
  for (auto& thread : threads) thread.join();
  for (size_t t = 0; t < errors.size(); ++t) EXPECT_LE(errors[t], 1e-5) << "thread " << t;
}

TEST(InferenceConv, LeavesWhatItDoesNotRunToLibTorch) {
  Pair p(nn::Conv2dOptions(4, 8, 3).padding(1), nn::BatchNorm2dOptions(8));
  EXPECT_TRUE(InferenceConv::supports(*p.conv, *p.norm, torch::randn({1, 4, 5, 5})));
  EXPECT_FALSE(InferenceConv::supports(*p.conv, *p.norm, torch::randn({1, 4, 5, 5}, torch::kDouble)));
  EXPECT_FALSE(InferenceConv::supports(*p.conv, *p.norm, torch::randn({1, 3, 5, 5})));  // wrong channels
  EXPECT_FALSE(InferenceConv::supports(*p.conv, *p.norm, torch::randn({0, 4, 5, 5})));  // empty batch
  Pair grouped(nn::Conv2dOptions(4, 8, 3).groups(2), nn::BatchNorm2dOptions(8));
  EXPECT_FALSE(InferenceConv::supports(*grouped.conv, *grouped.norm, torch::randn({1, 4, 5, 5})));
  Pair same(nn::Conv2dOptions(4, 8, 3).padding(torch::kSame), nn::BatchNorm2dOptions(8));
  EXPECT_FALSE(InferenceConv::supports(*same.conv, *same.norm, torch::randn({1, 4, 5, 5})));
  Pair reflect(nn::Conv2dOptions(4, 8, 3).padding(1).padding_mode(torch::kReflect), nn::BatchNorm2dOptions(8));
  EXPECT_FALSE(InferenceConv::supports(*reflect.conv, *reflect.norm, torch::randn({1, 4, 5, 5})));
  Pair no_stats(nn::Conv2dOptions(4, 8, 3), nn::BatchNorm2dOptions(8).track_running_stats(false));
  EXPECT_FALSE(InferenceConv::supports(*no_stats.conv, *no_stats.norm, torch::randn({1, 4, 5, 5})));
  EXPECT_FALSE(InferenceConv::supports(*no_stats.conv, *p.norm, torch::randn({1, 4, 2, 2})));  // no output pixel
}

}  // namespace
}  // namespace lockstep::models
