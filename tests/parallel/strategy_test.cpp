#include "lockstep/parallel/strategy.h"
#include "lockstep/parallel/strategy_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <limits>
#include <thread>

#include "../dist/multi_rank.h"
#include "lent_group.h"
#include "../test_util.h"
#include "lockstep/models/convnet.h"
#include "lockstep/models/mlp.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/ddp_strategy.h"
#include "lockstep/parallel/local_strategy.h"
#include "lockstep/parallel/step_guard.h"

namespace lockstep::parallel {
namespace {

using ::testing::HasSubstr;
using lockstep::testing::run_ranks;
namespace F = torch::nn::functional;

torch::Tensor cross_entropy(const torch::Tensor& out, const torch::Tensor& y) { return F::cross_entropy(out, y); }

StrategyOptions with_optimizer(optim::OptimizerKind kind) {
  const optim::OptimizerOptions o = optim::OptimizerOptions(kind, kind == optim::OptimizerKind::kSGD ? 0.1 : 0.01)
                                        .momentum(kind == optim::OptimizerKind::kSGD ? 0.9 : 0.0);
  return StrategyOptions().optimizer([o](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), o); });
}

struct Data {
  torch::Tensor x, y;  // x (N, 1, 28, 28), y (N)
};

Data random_data(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {torch::randn({n, 1, 28, 28}, gen), torch::randint(0, 10, {n}, gen, torch::kInt64)};
}

// `steps` optimizer steps of `strategy`, step k on the `batch` samples of `d` from k * stride + offset.
void train(Strategy& strategy, const Data& d, int64_t steps, int64_t stride, int64_t offset, int64_t batch) {
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t start = k * stride + offset;
    strategy.forward_backward({{d.x.narrow(0, start, batch), d.y.narrow(0, start, batch), 1.0}}, cross_entropy);
    ASSERT_TRUE(strategy.step().stepped);
  }
}

class EveryOptimizer : public ::testing::TestWithParam<optim::OptimizerKind> {};

// 2 ranks x batch B through the ddp strategy == the local strategy over the same 2B samples, for
// every optimizer: the gradients are averaged before any optimizer sees them.
// Against two accumulated micro-batches of B (weight 1/2 each) the runs agree bit for bit on any
// CPU: each side adds the same two halved gradients (halving is exact in binary floating point)
// with one rounding, and a sum of two terms does not depend on their order. Against one batch of
// 2B the gradient is summed in another order (~1e-7 relative, the order varying with the CPU's
// kernels): SGD, linear in the gradient, keeps that far below 1e-5; Adam is not compared so,
// because m / sqrt(v) turns rounding in a near-zero gradient into a step of up to lr.
TEST_P(EveryOptimizer, DdpOfTwoRanksEqualsLocalWithTheDoubleBatch) {
  const Data d = random_data(96, 3);
  torch::manual_seed(1);
  auto initial = std::make_shared<models::MLPImpl>();
  auto copy = [&] {
    auto model = std::make_shared<models::MLPImpl>();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < model->parameters().size(); ++i) model->parameters()[i].copy_(initial->parameters()[i]);
    return model;
  };
  auto accumulated = copy();
  LocalStrategy local(torch::nn::AnyModule(accumulated), with_optimizer(GetParam()));
  for (int64_t k = 0; k < 4; ++k) {
    local.forward_backward({{d.x.narrow(0, 24 * k, 12), d.y.narrow(0, 24 * k, 12), 0.5},
                            {d.x.narrow(0, 24 * k + 12, 12), d.y.narrow(0, 24 * k + 12, 12), 0.5}},
                           cross_entropy);
    ASSERT_TRUE(local.step().stepped);
  }
  const bool sgd = GetParam() == optim::OptimizerKind::kSGD;
  auto double_batch = copy();
  if (sgd) {
    LocalStrategy one_batch(torch::nn::AnyModule(double_batch), with_optimizer(GetParam()));
    train(one_batch, d, 4, 24, 0, 24);
  }

  std::vector<std::vector<torch::Tensor>> finals(2);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    torch::manual_seed(100 + rank);  // different weights: rank 0's must win
    auto model = rank == 0 ? copy() : std::make_shared<models::MLPImpl>();
    DdpStrategy ddp(torch::nn::AnyModule(model), with_optimizer(GetParam()).group(testing::lent(group)));
    train(ddp, d, 4, 24, 12 * rank, 12);
    for (const auto& p : model->parameters()) finals[rank].push_back(p.detach().clone());
  });
  const auto exact = accumulated->parameters(), close = double_batch->parameters();
  for (size_t i = 0; i < exact.size(); ++i) {
    EXPECT_TRUE(torch::equal(finals[0][i], finals[1][i])) << "ranks differ at parameter " << i;
    EXPECT_TRUE(torch::equal(finals[0][i], exact[i]))
        << "parameter " << i << ": max difference " << (finals[0][i] - exact[i]).abs().max().item<double>();
    if (sgd) EXPECT_LE((finals[0][i] - close[i]).abs().max().item<double>(), 1e-5) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Strategy, EveryOptimizer,
                         ::testing::Values(optim::OptimizerKind::kSGD, optim::OptimizerKind::kAdam,
                                           optim::OptimizerKind::kAdamW),
                         [](const auto& info) { return optim::to_string(info.param); });

// Rank 0 builds an mlp, rank 1 a convnet: at every opt level both ranks end with DDP's error naming
// the first differing parameter and both shapes, before any weight travels (a weight broadcast of
// mismatched sizes would abort inside Gloo instead), well within the group's timeout.
TEST(DdpStrategy, MismatchedModelsEndEveryRankWithTheFirstDifferenceAtEveryOptLevel) {
  for (amp::OptLevel level : {amp::OptLevel::kO0, amp::OptLevel::kO1, amp::OptLevel::kO2, amp::OptLevel::kO3}) {
    std::vector<std::string> messages(2);
    const auto start = std::chrono::steady_clock::now();
    run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
      torch::nn::AnyModule model = rank == 0 ? torch::nn::AnyModule(std::make_shared<models::MLPImpl>())
                                             : torch::nn::AnyModule(std::make_shared<models::ConvNetImpl>());
      messages[rank] = testing::error_message(
          [&] { DdpStrategy(model, with_optimizer(optim::OptimizerKind::kSGD).group(testing::lent(group)).opt_level(level)); });
    });
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << amp::to_string(level);
    EXPECT_THAT(messages[0], HasSubstr("the model differs across ranks (1 of 2 ranks disagree")) << amp::to_string(level);
    EXPECT_THAT(messages[1], HasSubstr("rank 1 has parameter 'layer1.0.weight' [16, 1, 5, 5]")) << amp::to_string(level);
    EXPECT_THAT(messages[1], HasSubstr("where rank 0 has parameter 'fc1.weight' [256, 784]")) << amp::to_string(level);
  }
}

// A NaN loss on one rank only: both ranks skip the step and say which rank it was.
TEST(DdpStrategy, NonFiniteLossOnOneRankSkipsTheStepOnEveryRank) {
  const Data d = random_data(16, 5);
  std::vector<StepDecision> decisions(2);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    DdpStrategy ddp(torch::nn::AnyModule(std::make_shared<models::MLPImpl>()),
                    with_optimizer(optim::OptimizerKind::kSGD).group(testing::lent(group)));
    auto loss = [rank](const torch::Tensor& out, const torch::Tensor& y) {
      return F::cross_entropy(out, y) + (rank == 1 ? std::numeric_limits<double>::quiet_NaN() : 0.0);
    };
    ddp.forward_backward({{d.x.narrow(0, 8 * rank, 8), d.y.narrow(0, 8 * rank, 8), 1.0}}, loss);
    decisions[rank] = ddp.step();
  });
  for (const StepDecision& s : decisions) {
    EXPECT_FALSE(s.stepped);
    EXPECT_EQ(s.skip_reason, "non-finite loss on rank 1");
  }
}

// DDP's buffer broadcast before forward waits for the slowest rank: that wait is sync, not forward.
// Rank 1 starts its step 300 ms late (the sleep is the slow rank under test, not synchronisation):
// rank 0's profile shows the 300 ms in sync, and a forward far shorter than that.
TEST(DdpStrategy, WaitingForALateRankBeforeForwardIsTimedAsSync) {
  const Data d = random_data(16, 6);
  std::vector<ProfileSummary> profiles(2);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    StepProfiler profiler;
    DdpStrategy ddp(torch::nn::AnyModule(models::ConvNet(10)),
                    with_optimizer(optim::OptimizerKind::kSGD).group(testing::lent(group)).profiler(&profiler));
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ddp.forward_backward({{d.x.narrow(0, 8 * rank, 8), d.y.narrow(0, 8 * rank, 8), 1.0}}, cross_entropy);
    profiler.end_step();
    profiles[rank] = profiler.summary();
  });
  const auto ms = [&](Phase p) { return profiles[0].phases[static_cast<int>(p)].mean_ms; };
  EXPECT_GE(ms(Phase::kSync), 250.0);
  EXPECT_LT(ms(Phase::kForward), 150.0);
}

TEST(StepGuard, AllFiniteSeesNanAndInfButNotLargeFiniteValues) {
  const float big = std::numeric_limits<float>::max();
  EXPECT_TRUE(all_finite({torch::full({1000}, big), torch::ones({3})}));  // the fp32 sum would overflow
  EXPECT_FALSE(all_finite({torch::ones({4}), torch::tensor({1.0f, std::numeric_limits<float>::quiet_NaN()})}));
  EXPECT_FALSE(all_finite({torch::tensor({std::numeric_limits<float>::infinity()})}));
  // an overflowing sum is checked element by element: a NaN or inf among large values is still seen
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(all_finite({torch::cat({torch::full({1000}, big), torch::tensor({nan})})}));
  EXPECT_FALSE(all_finite({torch::cat({torch::full({1000}, -big), torch::tensor({-inf})})}));
  EXPECT_FALSE(all_finite({torch::tensor({std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()})}));
  EXPECT_TRUE(all_finite({torch::Tensor(), torch::zeros({2}, torch::kBFloat16)}));  // undefined: no gradient
}

TEST(Strategy, NamesAreListedOnceAndUnknownOnesAreRefused) {
  EXPECT_EQ(strategy_names(), (std::vector<std::string>{"local", "ddp", "dp", "zero1", "zero2", "fsdp", "pipeline"}));
  EXPECT_EQ(parse_strategy("ddp"), StrategyKind::kDdp);
  EXPECT_EQ(to_string(StrategyKind::kLocal), "local");
  EXPECT_THAT(testing::error_message([] { parse_strategy("zero9"); }),
              HasSubstr("unknown strategy 'zero9'; choose local, ddp, dp, zero1, zero2, fsdp, pipeline"));
  EXPECT_THAT(testing::error_message([] {
                make_strategy(StrategyKind::kDdp, torch::nn::AnyModule(std::make_shared<models::MLPImpl>()),
                              with_optimizer(optim::OptimizerKind::kSGD));
              }),
              HasSubstr("the ddp strategy needs a process group"));
}

}  // namespace
}  // namespace lockstep::parallel
