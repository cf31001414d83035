#include "lockstep/parallel/dp_strategy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../test_util.h"
#include "lockstep/models/convnet.h"
#include "lockstep/models/mlp.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/strategy_registry.h"
#include "lockstep/train/train.h"

namespace lockstep::parallel {
namespace {

using ::testing::HasSubstr;
namespace F = torch::nn::functional;

torch::Tensor cross_entropy(const torch::Tensor& out, const torch::Tensor& y) { return F::cross_entropy(out, y); }

// Adam's lr is 1e-3: its update is about +-lr wherever a gradient is tiny, whatever the tiny value,
// so fp32 summation-order noise in such a gradient moves the parameter by up to lr per step.
StrategyOptions options_for(optim::OptimizerKind kind, int64_t replicas, ModelFactory factory) {
  const optim::OptimizerOptions o = optim::OptimizerOptions(kind, kind == optim::OptimizerKind::kSGD ? 0.1 : 1e-3)
                                        .momentum(kind == optim::OptimizerKind::kSGD ? 0.9 : 0.0);
  return StrategyOptions()
      .optimizer([o](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), o); })
      .replicas(replicas)
      .model_factory(std::move(factory));
}

// Models built after the same seed start from the same weights.
template <typename Impl>
std::shared_ptr<Impl> seeded(uint64_t seed) {
  torch::manual_seed(seed);
  return std::make_shared<Impl>();
}

template <typename Impl>
ModelFactory factory() {
  return [] { return torch::nn::AnyModule(std::make_shared<Impl>()); };
}

double max_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

struct Case {
  optim::OptimizerKind optimizer;
  int64_t replicas;
  int64_t batch;  // not a multiple of replicas: torch.chunk's uneven last chunk
};

class DpEqualsOneReplica : public ::testing::TestWithParam<Case> {};

// N replicas on threads == one replica on the whole batch, over 4 optimizer steps of 2
// micro-batches each (accumulation), with SGD-momentum and Adam. 1e-5: fp32 sums in another order
// (Adam divides by sqrt(v), which amplifies them a little).
TEST_P(DpEqualsOneReplica, OverStepsWithAccumulation) {
  const Case c = GetParam();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const torch::Tensor x = torch::randn({8 * c.batch, 1, 28, 28}, gen), y = torch::randint(0, 10, {8 * c.batch}, gen);
  auto reference = seeded<models::MLPImpl>(1), primary = seeded<models::MLPImpl>(1);
  LocalStrategy local(torch::nn::AnyModule(reference), options_for(c.optimizer, 0, nullptr));
  DpStrategy dp(torch::nn::AnyModule(primary), options_for(c.optimizer, c.replicas, factory<models::MLPImpl>()));
  ASSERT_EQ(dp.replicas(), c.replicas);
  for (int64_t step = 0; step < 4; ++step) {
    std::vector<MicroBatch> micro_batches;
    for (int64_t m = 0; m < 2; ++m) {
      const int64_t start = (2 * step + m) * c.batch;
      micro_batches.push_back({x.narrow(0, start, c.batch), y.narrow(0, start, c.batch), 0.5});
    }
    const double expected = local.forward_backward(micro_batches, cross_entropy);
    const double actual = dp.forward_backward(micro_batches, cross_entropy);
    EXPECT_NEAR(actual, expected, 1e-5) << "step " << step;
    std::vector<torch::Tensor> dp_grads, local_grads;
    for (const auto& p : primary->parameters()) dp_grads.push_back(p.grad());
    for (const auto& p : reference->parameters()) local_grads.push_back(p.grad());
    EXPECT_LE(max_difference(dp_grads, local_grads), 1e-5) << "gradients at step " << step;
    ASSERT_TRUE(local.step().stepped);
    ASSERT_TRUE(dp.step().stepped);
  }
  EXPECT_LE(max_difference(primary->parameters(), reference->parameters()), 1e-5);
  torch::NoGradGuard no_grad;
  EXPECT_LE((dp.forward(x.narrow(0, 0, 11)) - reference->forward(x.narrow(0, 0, 11))).abs().max().item<double>(), 1e-5)
      << "evaluation, scattered over the replicas";
  // N copies of the parameters and gradients; the optimizer state once.
  const MemoryReport one = local.memory(), all = dp.memory();
  EXPECT_EQ(all.param_bytes, c.replicas * one.param_bytes);
  EXPECT_EQ(all.grad_bytes, c.replicas * one.grad_bytes);
  EXPECT_EQ(all.optim_bytes, one.optim_bytes);
}

INSTANTIATE_TEST_SUITE_P(DpStrategy, DpEqualsOneReplica,
                         ::testing::Values(Case{optim::OptimizerKind::kSGD, 2, 24}, Case{optim::OptimizerKind::kAdam, 2, 24},
                                           Case{optim::OptimizerKind::kSGD, 3, 25}),
                         [](const auto& info) {
                           return optim::to_string(info.param.optimizer) + "_" + std::to_string(info.param.replicas) +
                                  "_replicas";
                         });

// BatchNorm under dp, as under PyTorch's DataParallel: each replica normalises its chunk with the
// chunk's own statistics, so the gradient is that of one model applied to each chunk separately
// (not to the whole batch), and the running statistics kept are those of chunk 0 alone.
TEST(DpStrategy, BatchNormUsesEachReplicasChunkStatisticsAndKeepsChunkZerosRunningStats) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const torch::Tensor x = torch::randn({16, 1, 28, 28}, gen) * 2 + 0.5, y = torch::randint(0, 10, {16}, gen);
  auto primary = seeded<models::ConvNetImpl>(5);
  DpStrategy dp(torch::nn::AnyModule(primary),
                options_for(optim::OptimizerKind::kSGD, 2, factory<models::ConvNetImpl>()));
  dp.forward_backward({{x, y, 1.0}}, cross_entropy);

  // Reference 1: one model, each half separately, in one graph (per-chunk statistics).
  auto per_chunk = seeded<models::ConvNetImpl>(5);
  const torch::Tensor out = torch::cat({per_chunk->forward(x.narrow(0, 0, 8)), per_chunk->forward(x.narrow(0, 8, 8))});
  F::cross_entropy(out, y).backward();
  // Reference 2: the whole batch through one model (whole-batch statistics).
  auto whole = seeded<models::ConvNetImpl>(5);
  F::cross_entropy(whole->forward(x), y).backward();
  // Reference 3: chunk 0 alone, for the running statistics.
  auto chunk0 = seeded<models::ConvNetImpl>(5);
  chunk0->forward(x.narrow(0, 0, 8));

  std::vector<torch::Tensor> dp_grads, chunk_grads, whole_grads;
  for (const auto& p : primary->parameters()) dp_grads.push_back(p.grad());
  for (const auto& p : per_chunk->parameters()) chunk_grads.push_back(p.grad());
  for (const auto& p : whole->parameters()) whole_grads.push_back(p.grad());
  EXPECT_LE(max_difference(dp_grads, chunk_grads), 1e-5);
  EXPECT_GT(max_difference(dp_grads, whole_grads), 1e-3) << "per-chunk statistics must differ from the whole batch's";
  const auto dp_buffers = primary->named_buffers();
  for (const auto& b : chunk0->named_buffers())
    EXPECT_LE((dp_buffers[b.key()].to(torch::kDouble) - b.value().to(torch::kDouble)).abs().max().item<double>(), 1e-6)
        << b.key();
}

TEST(DpStrategy, RefusesAMissingFactoryAMismatchedOneAndAProcessGroup) {
  EXPECT_THAT(testing::error_message([] {
                DpStrategy(torch::nn::AnyModule(std::make_shared<models::MLPImpl>()),
                           options_for(optim::OptimizerKind::kSGD, 2, nullptr));
              }),
              HasSubstr("the dp strategy needs StrategyOptions().model_factory(...) to build its 1 extra replica(s)"));
  EXPECT_THAT(testing::error_message([] {
                DpStrategy(torch::nn::AnyModule(std::make_shared<models::MLPImpl>()),
                           options_for(optim::OptimizerKind::kSGD, 2, factory<models::ConvNetImpl>()));
              }),
              HasSubstr("the factory must build the same architecture"));
  EXPECT_THAT(testing::error_message([] {
                auto run = train::TrainOptions().model("mlp").data(train::DataSource::kSynthetic).limit(20);
                run.trainer().progress(nullptr).strategy_options().replicas(3);
                train::train(run);
              }),
              HasSubstr("--replicas 3 applies to --strategy dp"));
}

// Through the trainer: --strategy dp trains, evaluates, and reports two replicas' memory.
TEST(DpStrategy, TrainsThroughTheTrainerWithItsReplicasMemory) {
  auto run = train::TrainOptions().model("convnet").data(train::DataSource::kSynthetic).limit(200);
  run.trainer().batch_size(50).progress(nullptr);
  const train::TrainResult local = train::train(run);
  run.trainer().strategy(StrategyKind::kDp).strategy_options().replicas(2);
  const train::TrainResult dp = train::train(run);
  EXPECT_EQ(dp.steps, 4);
  EXPECT_EQ(dp.param_bytes, 2 * local.param_bytes);
  EXPECT_TRUE(std::isfinite(dp.final_loss));
  EXPECT_GE(dp.test_acc, 0.0);
}

}  // namespace
}  // namespace lockstep::parallel
