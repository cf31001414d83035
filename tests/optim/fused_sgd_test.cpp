#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "../../src/optim/fused_sgd.h"

namespace lockstep::optim {
namespace {

// The largest difference relative to the larger of 1 and the value: fp32 rounding of one
// operation is ~6e-8 of it.
double worst(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got.to(torch::kDouble) - want.to(torch::kDouble)).abs() / want.to(torch::kDouble).abs().clamp_min(1))
      .max()
      .item<double>();
}

// Against LibTorch's SGD, step for step: every parameter and momentum buffer after each of four
// steps (the first creates the buffers) within 1e-6. The parameters: sizes around the kernel's
// eight lanes (1, 7, 8, 19 and 1000 elements), a transposed (non-contiguous) one and an fp64 one
// (both on LibTorch's operators), and one without a gradient (left alone). Each updated parameter's
// version counter moves, as an in-place add_ moves it.
TEST(FusedSGD, StepsAsLibTorchsSGDDoes) {
  struct Case {
    std::string name;
    torch::optim::SGDOptions options;
  };
  const std::vector<Case> cases = {
      {"plain", torch::optim::SGDOptions(0.1)},
      {"momentum", torch::optim::SGDOptions(0.05).momentum(0.9)},
      {"nesterov and weight decay", torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3)},
      {"dampening and weight decay", torch::optim::SGDOptions(0.2).momentum(0.5).dampening(0.25).weight_decay(0.01)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    torch::manual_seed(3);
    std::vector<torch::Tensor> init = {torch::randn({1}), torch::randn({7}), torch::randn({2, 4}), torch::randn({19}),
                                       torch::randn({10, 100}), torch::randn({6, 5}).t(),
                                       torch::randn({9}, torch::kDouble), torch::randn({3})};
    std::vector<torch::Tensor> a, b;
    for (const auto& t : init) {
      a.push_back(t.clone().requires_grad_());
      b.push_back((t.is_contiguous() ? t.clone() : t.t().clone().t()).requires_grad_());
    }
    ASSERT_FALSE(b[5].is_contiguous());
    torch::optim::SGD theirs(a, c.options);
    FusedSGD ours(b, c.options);
    for (int step = 0; step < 4; ++step) {
      for (size_t i = 0; i + 1 < init.size(); ++i) {
        const torch::Tensor g = torch::randn(init[i].sizes(), init[i].options());
        a[i].mutable_grad() = g.clone();
        b[i].mutable_grad() = g.clone();
      }
      std::vector<int64_t> versions;
      for (const auto& p : b) versions.push_back(p._version());
      theirs.step();
      ours.step();
      for (size_t i = 0; i < init.size(); ++i) {
        EXPECT_LE(worst(b[i], a[i]), 1e-6) << "parameter " << i << ", step " << step;
        // Written in place as LibTorch's add_ writes: a graph that saved the parameter notices.
        if (i + 1 < init.size()) EXPECT_GT(b[i]._version(), versions[i]) << "parameter " << i;
        const auto& theirs_state = theirs.state();
        const auto& ours_state = ours.state();
        void* const key_a = a[i].unsafeGetTensorImpl();
        void* const key_b = b[i].unsafeGetTensorImpl();
        ASSERT_EQ(theirs_state.count(key_a), ours_state.count(key_b)) << "parameter " << i;
        if (theirs_state.count(key_a) == 0) continue;
        const auto& sa = static_cast<const torch::optim::SGDParamState&>(*theirs_state.at(key_a));
        const auto& sb = static_cast<const torch::optim::SGDParamState&>(*ours_state.at(key_b));
        EXPECT_LE(worst(sb.momentum_buffer(), sa.momentum_buffer()), 1e-6) << "buffer " << i << ", step " << step;
      }
    }
    EXPECT_TRUE(torch::equal(b.back(), init.back())) << "a parameter without a gradient moved";
  }
}

}  // namespace
}  // namespace lockstep::optim
