#include "lockstep/parallel/zero_strategy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <tuple>

#include "../dist/multi_rank.h"
#include "../test_util.h"
#include "sharding_fixtures.h"
#include "lockstep/models/mlp.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/optim/state_dict.h"
#include "lockstep/parallel/ddp_strategy.h"
#include "lockstep/parallel/local_strategy.h"
#include "lockstep/parallel/strategy_registry.h"

namespace lockstep::parallel {
namespace {

using ::testing::HasSubstr;
using lockstep::testing::run_ranks;
using namespace sharding_test;  // NOLINT: the fixtures of these tests

// A bucket cap of 5 kB splits the mlp's gradient into two buckets: fc2 (2570 elements, all in
// rank 1's shard, so rank 0 receives nothing from it) and fc1 (200960, across both shards).
constexpr double kSmallBucketsMb = 5e-3;

ZeroOptions zero(int64_t stage) { return ZeroOptions().stage(stage).bucket_cap_mb(kSmallBucketsMb); }

struct Case {
  int64_t stage;
  OptimizerKind optimizer;
  bool accumulate_and_clip;  // 3 micro-batches per step and clip_norm 0.05 (every step clips)
};

class ZeroMatchesDdp : public ::testing::TestWithParam<Case> {};

// See expect_matches_ddp.
TEST_P(ZeroMatchesDdp, AfterFourStepsOnTwoRanks) {
  const Case c = GetParam();
  expect_matches_ddp(c.optimizer, c.accumulate_and_clip, [&](torch::nn::AnyModule model, StrategyOptions options) {
    return std::make_unique<ZeroStrategy>(std::move(model), std::move(options), zero(c.stage));
  });
}

INSTANTIATE_TEST_SUITE_P(
    Zero, ZeroMatchesDdp,
    ::testing::Values(Case{1, OptimizerKind::kSGD, false}, Case{1, OptimizerKind::kAdam, false},
                      Case{1, OptimizerKind::kAdamW, false}, Case{2, OptimizerKind::kSGD, false},
                      Case{2, OptimizerKind::kAdam, false}, Case{2, OptimizerKind::kAdamW, false},
                      Case{1, OptimizerKind::kAdam, true}, Case{2, OptimizerKind::kSGD, true},
                      Case{2, OptimizerKind::kAdamW, true}),
    [](const auto& info) {
      return "zero" + std::to_string(info.param.stage) + "_" + optim::to_string(info.param.optimizer) +
             (info.param.accumulate_and_clip ? "_accumulation_clip_norm" : "");
    });

// Adam, fp32: what each rank holds is the ZeRO paper's model exactly, with the mlp's 203530
// parameters padded to 2 x 101765.
TEST(ZeroStrategy, MemoryIsTheZeroPapersModelForAdam) {
  const Data d = random_data(48, 3);
  std::vector<MemoryReport> reports(3);
  const auto initial = mlp(1);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    const StrategyOptions options = with_optimizer(OptimizerKind::kAdam).group(testing::lent(group));
    DdpStrategy ddp(torch::nn::AnyModule(copy_of(*initial)), options);
    ZeroStrategy zero1(torch::nn::AnyModule(copy_of(*initial)), options, zero(1));
    ZeroStrategy zero2(torch::nn::AnyModule(copy_of(*initial)), options, zero(2));
    for (Strategy* s : std::vector<Strategy*>{&ddp, &zero1, &zero2}) train(*s, d, 0, 1, rank, false);
    if (rank == 1) reports = {ddp.memory(), zero1.memory(), zero2.memory()};
  });
  const int64_t psi = 203530, shard = 101765;
  EXPECT_EQ(reports[0].param_bytes, 4 * psi);
  EXPECT_EQ(reports[0].grad_bytes, 4 * psi);
  EXPECT_EQ(reports[0].optim_bytes, 8 * psi);
  EXPECT_EQ(reports[1].param_bytes, 4 * 2 * shard);
  EXPECT_EQ(reports[1].grad_bytes, 4 * 2 * shard);
  EXPECT_EQ(reports[1].optim_bytes, 8 * shard);
  EXPECT_EQ(reports[2].param_bytes, 4 * 2 * shard);
  EXPECT_EQ(reports[2].grad_bytes, 4 * shard);
  EXPECT_EQ(reports[2].optim_bytes, 8 * shard);
}

// The consolidated state is a replica's: after the same steps, zero2's training_state_dict()
// holds ddp's per-parameter Adam moments, on both ranks.
TEST(ZeroStrategy, ConsolidatedOptimizerStateIsTheReplicasPerParameterState) {
  const Data d = random_data(72, 4);
  std::vector<c10::IValue> ddp_state(2), zero_state(2);
  const auto initial = mlp(2);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    const StrategyOptions options = with_optimizer(OptimizerKind::kAdam).group(testing::lent(group));
    DdpStrategy ddp(torch::nn::AnyModule(copy_of(*initial)), options);
    ZeroStrategy zero2(torch::nn::AnyModule(copy_of(*initial)), options, zero(2));
    train(ddp, d, 0, 3, rank, false);
    train(zero2, d, 0, 3, rank, false);
    ddp_state[rank] = ddp.training_state_dict().at("optimizer");
    zero_state[rank] = zero2.training_state_dict().at("optimizer");
  });
  for (int64_t rank : {0, 1}) {
    const auto expected = ddp_state[rank].toGenericDict().at("state").toGenericDict();
    const auto actual = zero_state[rank].toGenericDict().at("state").toGenericDict();
    ASSERT_EQ(actual.size(), 4u);
    for (const auto& item : expected) {
      const auto want = item.value().toGenericDict();
      const auto have = actual.at(item.key()).toGenericDict();
      ASSERT_EQ(have.size(), want.size());
      for (const auto& entry : want) {
        const torch::Tensor w = entry.value().toTensor(), h = have.at(entry.key()).toTensor();
        ASSERT_EQ(h.sizes(), w.sizes()) << entry.key().toStringRef();
        EXPECT_LE((h - w).abs().max().item<double>(), 1e-6) << "rank " << rank << " " << entry.key().toStringRef();
      }
    }
    const auto group = zero_state[rank].toGenericDict().at("param_groups").toListRef()[0].toGenericDict();
    EXPECT_EQ(group.at("params").toList().size(), 4u);
  }
}

// See expect_resumes_like_ddp: zero2 -> ddp, ddp -> zero1, and zero2's 2-rank state in one process.
TEST(ZeroStrategy, CheckpointsResumeAcrossStrategiesAndWorldSizes) {
  expect_resumes_like_ddp({{StrategyKind::kZero2, StrategyKind::kDdp}, {StrategyKind::kDdp, StrategyKind::kZero1}});
}

// bf16 autocast (O1): zero2 follows ddp closely. The forward runs in bf16 on weights that differ
// from ddp's by fp32 rounding, so bf16 roundings may flip: 1e-3, against steps of ~1e-2.
TEST(ZeroStrategy, Bf16AutocastFollowsDdp) {
  const Data d = random_data(96, 8);
  std::vector<torch::Tensor> ddp_final, zero_final;
  const auto initial = mlp(4);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    const StrategyOptions options = with_optimizer(OptimizerKind::kAdam).group(testing::lent(group)).opt_level(amp::OptLevel::kO1);
    auto a = copy_of(*initial), b = copy_of(*initial);
    DdpStrategy ddp(torch::nn::AnyModule(a), options);
    ZeroStrategy zero2(torch::nn::AnyModule(b), options, zero(2));
    train(ddp, d, 0, 3, rank, false);
    train(zero2, d, 0, 3, rank, false);
    if (rank == 0) {
      ddp_final = copies(*a);
      zero_final = copies(*b);
    }
  });
  expect_close(zero_final, ddp_final, 1e-3, "O1 bf16");
}

// An infinite gradient on rank 0 for fc2.bias, which lies in rank 1's shard: after the
// reduce-scatter only rank 1 holds it, yet both ranks skip, name rank 1, and keep their weights.
// The loss value stays finite (sqrt(0) = 0, but its derivative at 0 is infinite), so only the
// gradient check can see it.
TEST(ZeroStrategy, NonFiniteGradientInOneShardSkipsTheStepOnEveryRank) {
  const Data d = random_data(16, 5);
  std::vector<StepDecision> decisions(2);
  std::vector<torch::Tensor> before(2), after(2);
  const auto initial = mlp(5);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    auto model = copy_of(*initial);
    ZeroStrategy zero2(torch::nn::AnyModule(model), with_optimizer(OptimizerKind::kSGD).group(testing::lent(group)), zero(2));
    const torch::Tensor bias = model->parameters().back();
    before[rank] = bias.detach().clone();
    auto loss = [&](const torch::Tensor& out, const torch::Tensor& y) {
      torch::Tensor l = F::cross_entropy(out, y);
      return rank == 0 ? l + torch::sqrt((bias - bias.detach()).sum()) : l;
    };
    zero2.forward_backward({{d.x.narrow(0, 8 * rank, 8), d.y.narrow(0, 8 * rank, 8), 1.0}}, loss);
    decisions[rank] = zero2.step();
    after[rank] = bias.detach().clone();
  });
  for (int64_t rank : {0, 1}) {
    EXPECT_FALSE(decisions[rank].stepped);
    EXPECT_EQ(decisions[rank].skip_reason, "non-finite gradient (averaged over ranks) in the shard of rank 1");
    EXPECT_TRUE(torch::equal(after[rank], before[0])) << "rank " << rank;
  }
}

TEST(ZeroStrategy, BadConfigurationsAreRefusedNamingTheFix) {
  auto model = [] { return torch::nn::AnyModule(std::make_shared<models::MLPImpl>()); };
  EXPECT_THAT(testing::error_message(
                  [&] { make_strategy(StrategyKind::kZero2, model(), with_optimizer(OptimizerKind::kAdam)); }),
              HasSubstr("the zero2 strategy shards the optimizer state across ranks and needs a process group"));
  EXPECT_THAT(testing::error_message([] { parse_strategy("zero3"); }),
              HasSubstr("unknown strategy 'zero3'; choose local, ddp, dp, zero1, zero2, fsdp, pipeline"));
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    const StrategyOptions o2 = with_optimizer(OptimizerKind::kAdam).group(testing::lent(group)).opt_level(amp::OptLevel::kO2);
    EXPECT_THAT(testing::error_message([&] { ZeroStrategy(model(), o2, ZeroOptions().stage(1)); }),
                HasSubstr("rank " + std::to_string(rank) +
                          ": the zero1 strategy trains at O0 (fp32) and O1 (autocast), not O2"));
    EXPECT_THAT(testing::error_message([&] { ZeroStrategy(model(), o2, ZeroOptions().stage(3)); }),
                HasSubstr("stage 3 is FSDP"));
  });
}

}  // namespace
}  // namespace lockstep::parallel
