#include "lockstep/parallel/fsdp_strategy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../dist/multi_rank.h"
#include "../test_util.h"
#include "lockstep/parallel/ddp_strategy.h"
#include "lockstep/parallel/local_strategy.h"
#include "lockstep/parallel/strategy_registry.h"
#include "sharding_fixtures.h"

namespace lockstep::parallel {
namespace {

using ::testing::HasSubstr;
using lockstep::testing::run_ranks;
using namespace sharding_test;  // NOLINT: the fixtures of these tests

// The mlp's units: fc1 (784 x 256 + 256 = 200960 parameters) and fc2 (256 x 10 + 10 = 2570),
// sharded over 2 ranks into 100480 and 1285 elements.
constexpr int64_t kFc1 = 200960, kFc2 = 2570;

struct Case {
  OptimizerKind optimizer;
  bool accumulate_and_clip;  // 3 micro-batches per step and clip_norm 0.05 (every step clips)
  FsdpOptions fsdp;
};

class FsdpMatchesDdp : public ::testing::TestWithParam<Case> {};

// See expect_matches_ddp; also with units kept gathered from forward to backward, and with the
// two blocks joined into one unit.
TEST_P(FsdpMatchesDdp, AfterFourStepsOnTwoRanks) {
  const Case c = GetParam();
  expect_matches_ddp(c.optimizer, c.accumulate_and_clip, [&](torch::nn::AnyModule model, StrategyOptions options) {
    return std::make_unique<FsdpStrategy>(std::move(model), options.fsdp(c.fsdp));
  });
}

INSTANTIATE_TEST_SUITE_P(
    Fsdp, FsdpMatchesDdp,
    ::testing::Values(Case{OptimizerKind::kSGD, false, {}}, Case{OptimizerKind::kAdam, false, {}},
                      Case{OptimizerKind::kAdamW, false, {}}, Case{OptimizerKind::kAdam, true, {}},
                      Case{OptimizerKind::kSGD, true, FsdpOptions().reshard_after_forward(false)},
                      Case{OptimizerKind::kAdamW, false, FsdpOptions().min_params(kFc1 + kFc2)},
                      Case{OptimizerKind::kAdam, true, FsdpOptions().prefetch(false)}),
    [](const auto& info) {
      const Case& c = info.param;
      return optim::to_string(c.optimizer) + (c.accumulate_and_clip ? "_accumulation_clip_norm" : "") +
             (c.fsdp.reshard_after_forward() ? "" : "_kept_gathered") + (c.fsdp.min_params() > 0 ? "_one_unit" : "") +
             (c.fsdp.prefetch() ? "" : "_no_prefetch");
    });

// Units follow the blocks, or join them up to --fsdp-min-params; between uses no unit holds its
// full parameters, and while the loss is computed (after the forward) none does either, unless
// reshard_after_forward is off.
TEST(FsdpStrategy, UnitsAreGatheredOnlyWhileInUse) {
  const Data d = random_data(24, 3);
  const auto initial = mlp(1);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    for (bool reshard : {true, false}) {
      FsdpStrategy fsdp(torch::nn::AnyModule(copy_of(*initial)),
                        with_optimizer(OptimizerKind::kAdam).group(testing::lent(group)).fsdp(FsdpOptions().reshard_after_forward(reshard)));
      ASSERT_EQ(fsdp.units().size(), 2u);
      EXPECT_EQ(fsdp.units()[0]->name(), "fc1");
      EXPECT_EQ(fsdp.units()[0]->shard().numel(), kFc1 / 2);
      EXPECT_EQ(fsdp.units()[1]->shard().numel(), kFc2 / 2);
      std::vector<int64_t> held_at_loss;
      auto loss = [&](const torch::Tensor& out, const torch::Tensor& y) {
        for (const auto& unit : fsdp.units()) held_at_loss.push_back(unit->flat().flat().storage().nbytes());
        return cross_entropy(out, y);
      };
      fsdp.forward_backward({{d.x.narrow(0, 12 * rank, 12), d.y.narrow(0, 12 * rank, 12), 1.0}}, loss);
      ASSERT_TRUE(fsdp.step().stepped);
      const std::vector<int64_t> expected_at_loss =
          reshard ? std::vector<int64_t>{0, 0} : std::vector<int64_t>{4 * kFc1, 4 * kFc2};
      EXPECT_EQ(held_at_loss, expected_at_loss) << "reshard_after_forward " << reshard;
      for (const auto& unit : fsdp.units()) {
        EXPECT_FALSE(unit->gathered()) << unit->name();
        EXPECT_EQ(unit->flat().flat().storage().nbytes(), 0u) << unit->name();
        EXPECT_FALSE(unit->flat().params()[0].grad().defined()) << unit->name() << ": a full gradient was kept";
      }
    }
    FsdpStrategy joined(torch::nn::AnyModule(copy_of(*initial)),
                        with_optimizer(OptimizerKind::kAdam).group(testing::lent(group)).fsdp(FsdpOptions().min_params(kFc1 + 1)));
    ASSERT_EQ(joined.units().size(), 1u);
    EXPECT_EQ(joined.units()[0]->name(), "fc1+fc2");
  });
}

// Note [FSDP prefetch]: a prefetched unit is gathered at once and holds the full weights when
// gather() returns; reshard() of a unit whose all-gather is still under way waits for it, and the
// unit gathers correctly after that.
TEST(FsdpStrategy, PrefetchGathersTheUnitsWeights) {
  const auto initial = mlp(3);
  run_ranks(2, [&](int64_t, dist::ProcessGroup& group) {
    FsdpStrategy fsdp(torch::nn::AnyModule(copy_of(*initial)), with_optimizer(OptimizerKind::kSGD).group(testing::lent(group)));
    for (int round = 0; round < 3; ++round) {
      for (const auto& unit : fsdp.units()) {
        unit->prefetch();
        EXPECT_TRUE(unit->gathered()) << unit->name();
        if (round == 1) unit->reshard();  // while the all-gather may still run
        unit->gather();
      }
      const auto now = fsdp.units()[0]->flat().params();
      EXPECT_TRUE(torch::equal(now[0], initial->fc1->weight)) << "round " << round;
      EXPECT_TRUE(torch::equal(now[1], initial->fc1->bias)) << "round " << round;
      EXPECT_TRUE(torch::equal(fsdp.units()[1]->flat().params()[0], initial->fc2->weight)) << "round " << round;
      for (const auto& unit : fsdp.units()) unit->reshard();
    }
  });
}

// Adam, fp32, 2 ranks: 16 bytes per parameter divided by N, plus the units gathered at once (both of
// this model's two with prefetch, the larger without: Note [FSDP prefetch]), and
// per step three times (N-1)/N of the parameters' bytes on the wire: an all-gather in forward,
// another in backward and a reduce-scatter (the ZeRO paper's 3Psi), plus 24 bytes of the step's
// loss vote and norm all-reduce.
TEST(FsdpStrategy, MemoryAndBytesSentAreTheZeroPapersStage3) {
  const Data d = random_data(48, 3);
  const auto initial = mlp(1);
  for (bool prefetch : {true, false}) {
    std::vector<MemoryReport> reports(2);
    std::vector<int64_t> sent(2);
    run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
      FsdpStrategy fsdp(torch::nn::AnyModule(copy_of(*initial)),
                        with_optimizer(OptimizerKind::kAdam).group(testing::lent(group)).fsdp(FsdpOptions().prefetch(prefetch)));
      train(fsdp, d, 0, 1, rank, false);
      const int64_t before = group.bytes_sent();
      train(fsdp, d, 1, 1, rank, false);
      sent[rank] = group.bytes_sent() - before;
      reports[rank] = fsdp.memory();
    });
    const int64_t shards = kFc1 / 2 + kFc2 / 2, psi = kFc1 + kFc2;  // both even: no padding
    for (int64_t rank : {0, 1}) {
      EXPECT_EQ(reports[rank].param_bytes, 4 * shards + 4 * (prefetch ? psi : kFc1)) << "rank " << rank;
      EXPECT_EQ(reports[rank].grad_bytes, 4 * shards);
      EXPECT_EQ(reports[rank].optim_bytes, 8 * shards);
      EXPECT_EQ(sent[rank], 3 * (4 * psi / 2) + 24) << "prefetch " << prefetch;
    }
  }
}

// See expect_resumes_like_ddp: fsdp -> ddp, zero2 -> fsdp, and fsdp's 2-rank state in one process.
TEST(FsdpStrategy, CheckpointsResumeAcrossStrategiesAndWorldSizes) {
  expect_resumes_like_ddp({{StrategyKind::kFsdp, StrategyKind::kDdp}, {StrategyKind::kZero2, StrategyKind::kFsdp}});
}

// bf16 autocast (O1): fsdp follows ddp closely. The forward runs in bf16 on weights that differ
// from ddp's by fp32 rounding, so bf16 roundings may flip: 1e-3, against steps of ~1e-2.
TEST(FsdpStrategy, Bf16AutocastFollowsDdp) {
  const Data d = random_data(96, 8);
  std::vector<torch::Tensor> ddp_final, fsdp_final;
  const auto initial = mlp(4);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    const StrategyOptions options = with_optimizer(OptimizerKind::kAdam).group(testing::lent(group)).opt_level(amp::OptLevel::kO1);
    auto a = copy_of(*initial);
    DdpStrategy ddp(torch::nn::AnyModule(a), options);
    FsdpStrategy fsdp(torch::nn::AnyModule(copy_of(*initial)), options);
    train(ddp, d, 0, 3, rank, false);
    train(fsdp, d, 0, 3, rank, false);
    const auto w = weights(fsdp);
    if (rank == 0) {
      ddp_final = copies(*a);
      fsdp_final = w;
    }
  });
  expect_close(fsdp_final, ddp_final, 1e-3, "O1 bf16");
}

// A user's module without blocks: flatten, then a linear layer.
struct FlatLinear : torch::nn::Module {
  FlatLinear() : fc(register_module("fc", torch::nn::Linear(784, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc(x.flatten(1)); }
  torch::nn::Linear fc;
};

// A module that is not a reference model (no blocks) is one unit, and evaluation (no grad)
// gathers and frees it: its output is the replica's.
TEST(FsdpStrategy, AnyModuleIsOneUnitAndEvaluatesAsTheReplica) {
  const Data d = random_data(8, 9);
  torch::manual_seed(6);
  torch::nn::Linear initial(784, 10);
  std::vector<torch::Tensor> outputs(2);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    auto model = std::make_shared<FlatLinear>();
    {
      torch::NoGradGuard no_grad;
      model->fc->weight.copy_(initial->weight);
      model->fc->bias.copy_(initial->bias);
    }
    FsdpStrategy fsdp(torch::nn::AnyModule(model), with_optimizer(OptimizerKind::kSGD).group(testing::lent(group)));
    ASSERT_EQ(fsdp.units().size(), 1u);
    EXPECT_EQ(fsdp.units()[0]->name(), "model");
    torch::NoGradGuard no_grad;
    outputs[rank] = fsdp.forward(d.x);
    EXPECT_FALSE(fsdp.units()[0]->gathered());
  });
  const torch::Tensor expected = initial->forward(d.x.flatten(1));
  for (int64_t rank : {0, 1}) EXPECT_LE((outputs[rank] - expected).abs().max().item<double>(), 1e-6);
}

TEST(FsdpStrategy, BadConfigurationsAreRefusedNamingTheFix) {
  auto model = [] { return torch::nn::AnyModule(std::make_shared<models::MLPImpl>()); };
  EXPECT_THAT(testing::error_message(
                  [&] { make_strategy(StrategyKind::kFsdp, model(), with_optimizer(OptimizerKind::kAdam)); }),
              HasSubstr("the fsdp strategy shards the parameters across ranks and needs a process group: "
                        "StrategyOptions().group(...), with the program started under a launcher"));
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    const StrategyOptions options = with_optimizer(OptimizerKind::kAdam).group(testing::lent(group));
    EXPECT_THAT(testing::error_message([&] { FsdpStrategy(model(), StrategyOptions(options).opt_level(amp::OptLevel::kO2)); }),
                HasSubstr("rank " + std::to_string(rank) + ": the fsdp strategy trains at O0 (fp32) and O1 (autocast), not O2"));
    EXPECT_THAT(testing::error_message([&] { FsdpStrategy(model(), StrategyOptions(options).fsdp(FsdpOptions().min_params(-1))); }),
                HasSubstr("FsdpOptions::min_params -1 must be >= 0"));
  });
}

}  // namespace
}  // namespace lockstep::parallel
