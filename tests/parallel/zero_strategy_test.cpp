#include "lockstep/parallel/zero_strategy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <tuple>

#include "../dist/multi_rank.h"
#include "../test_util.h"
#include "lockstep/models/mlp.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/optim/state_dict.h"
#include "lockstep/parallel/ddp_strategy.h"
#include "lockstep/parallel/local_strategy.h"

namespace lockstep::parallel {
namespace {

using ::testing::HasSubstr;
using lockstep::testing::run_ranks;
using optim::OptimizerKind;
namespace F = torch::nn::functional;

torch::Tensor cross_entropy(const torch::Tensor& out, const torch::Tensor& y) { return F::cross_entropy(out, y); }

StrategyOptions with_optimizer(OptimizerKind kind) {
  const optim::OptimizerOptions o =
      optim::OptimizerOptions(kind, kind == OptimizerKind::kSGD ? 0.1 : 0.01)
          .momentum(kind == OptimizerKind::kSGD ? 0.9 : 0.0);
  return StrategyOptions().optimizer(
      [o](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), o); });
}

// A bucket cap of 5 kB splits the mlp's gradient into two buckets: fc2 (2570 elements, all in
// rank 1's shard, so rank 0 receives nothing from it) and fc1 (200960, across both shards).
constexpr double kSmallBucketsMb = 5e-3;

ZeroOptions zero(int64_t stage) { return ZeroOptions().stage(stage).bucket_cap_mb(kSmallBucketsMb); }

struct Data {
  torch::Tensor x, y;  // x (N, 1, 28, 28), y (N)
};

Data random_data(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {torch::randn({n, 1, 28, 28}, gen), torch::randint(0, 10, {n}, gen, torch::kInt64)};
}

// Initial weights are drawn on the test's thread: rank threads share the global generator, so
// models they seeded and built at the same time would interleave its draws.
std::shared_ptr<models::MLPImpl> mlp(uint64_t seed) {
  torch::manual_seed(seed);
  return std::make_shared<models::MLPImpl>();
}

// A new mlp holding `from`'s weights, plus `offset` (a rank's weights that differ from rank 0's).
std::shared_ptr<models::MLPImpl> copy_of(const models::MLPImpl& from, double offset = 0.0) {
  auto m = std::make_shared<models::MLPImpl>();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < m->parameters().size(); ++i) m->parameters()[i].copy_(from.parameters()[i] + offset);
  return m;
}

// `steps` optimizer steps from step `first` on; step k on rank `rank` takes 3 micro-batches of 4
// samples (weights 1/3) or, without accumulation, one of 12, from a rank-specific range of `d`.
void train(Strategy& strategy, const Data& d, int64_t first, int64_t steps, int64_t rank, bool accumulate) {
  for (int64_t k = first; k < first + steps; ++k) {
    const int64_t start = k * 24 + 12 * rank;
    std::vector<MicroBatch> micro_batches;
    if (accumulate) {
      for (int64_t m = 0; m < 3; ++m)
        micro_batches.push_back({d.x.narrow(0, start + 4 * m, 4), d.y.narrow(0, start + 4 * m, 4), 1.0 / 3.0});
    } else {
      micro_batches.push_back({d.x.narrow(0, start, 12), d.y.narrow(0, start, 12), 1.0});
    }
    strategy.forward_backward(micro_batches, cross_entropy);
    ASSERT_TRUE(strategy.step().stepped) << strategy.name() << " step " << k;
  }
}

std::vector<torch::Tensor> copies(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

void expect_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, double tolerance,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_LE((a[i] - b[i]).abs().max().item<double>(), tolerance) << what << ", parameter " << i;
}

struct Case {
  int64_t stage;
  OptimizerKind optimizer;
  bool accumulate_and_clip;  // 3 micro-batches per step and clip_norm 0.05 (every step clips)
};

class ZeroMatchesDdp : public ::testing::TestWithParam<Case> {};

// The same model, data and seed through ddp and through zero1 / zero2 on 2 real ranks end with
// the same parameters after 4 steps, on both ranks. 1e-5 in fp32: the gradient is averaged in
// another order (reduce-scatter of flat buckets against DDP's bucketed all-reduce), nothing else
// differs: the optimizers are element-wise.
TEST_P(ZeroMatchesDdp, AfterFourStepsOnTwoRanks) {
  const Case c = GetParam();
  const Data d = random_data(120, 7);
  std::vector<std::vector<torch::Tensor>> ddp_final(2), zero_final(2);
  const auto initial = mlp(11);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    StrategyOptions options = with_optimizer(c.optimizer).group(&group).clip_norm(c.accumulate_and_clip ? 0.05 : 0.0);
    // Rank 1's weights differ: both strategies start from rank 0's.
    auto a = copy_of(*initial, 0.5 * rank), b = copy_of(*initial, 0.5 * rank);
    DdpStrategy ddp(torch::nn::AnyModule(a), options);
    ZeroStrategy sharded(torch::nn::AnyModule(b), options, zero(c.stage));
    train(ddp, d, 0, 4, rank, c.accumulate_and_clip);
    train(sharded, d, 0, 4, rank, c.accumulate_and_clip);
    ddp_final[rank] = copies(*a);
    zero_final[rank] = copies(*b);
  });
  expect_close(zero_final[0], ddp_final[0], 1e-5, "rank 0 against ddp");
  expect_close(zero_final[1], zero_final[0], 0.0, "rank 1 against rank 0");
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
    const StrategyOptions options = with_optimizer(OptimizerKind::kAdam).group(&group);
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
    const StrategyOptions options = with_optimizer(OptimizerKind::kAdam).group(&group);
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

struct Saved {
  c10::Dict<std::string, torch::Tensor> model;
  c10::impl::GenericDict training{c10::StringType::get(), c10::AnyType::get()};
};

// A fresh strategy of `kind` over an mlp holding `saved`'s weights and training state.
std::unique_ptr<Strategy> resumed(StrategyKind kind, const Saved& saved, StrategyOptions options) {
  auto model = std::make_shared<models::MLPImpl>();
  models::load_state_dict(*model, saved.model, "saved model");
  auto s = make_strategy(kind, torch::nn::AnyModule(model), std::move(options));
  s->load_training_state_dict(saved.training, "saved state");
  return s;
}

// Checkpoints move between strategies: 3 steps under one and 3 under another end where 6 steps of
// ddp end (Adam, whose moments and step count must carry over), for zero2 -> ddp and ddp -> zero1;
// and zero2's 2-rank state resumes in one process (local, the double batch), ending where 6 local
// steps end.
TEST(ZeroStrategy, CheckpointsResumeAcrossStrategiesAndWorldSizes) {
  const Data d = random_data(144, 5);
  std::vector<std::vector<torch::Tensor>> straight(2), zero2_to_ddp(2), ddp_to_zero1(2);
  Saved from_zero2;
  const auto initial = mlp(3);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    const StrategyOptions options = with_optimizer(OptimizerKind::kAdam).group(&group);
    auto reference = copy_of(*initial);
    DdpStrategy ddp(torch::nn::AnyModule(reference), options);
    train(ddp, d, 0, 6, rank, false);
    straight[rank] = copies(*reference);

    for (const auto& [first, second] : {std::pair{StrategyKind::kZero2, StrategyKind::kDdp},
                                        std::pair{StrategyKind::kDdp, StrategyKind::kZero1}}) {
      Saved saved;
      {
        auto s = make_strategy(first, torch::nn::AnyModule(copy_of(*initial)), options);
        train(*s, d, 0, 3, rank, false);
        saved.model = s->model_state_dict();
        saved.training = s->training_state_dict();  // collective: every rank
      }
      auto s = resumed(second, saved, options);
      train(*s, d, 3, 3, rank, false);
      (first == StrategyKind::kZero2 ? zero2_to_ddp : ddp_to_zero1)[rank] = copies(s->module());
      if (first == StrategyKind::kZero2 && rank == 0) from_zero2 = saved;
    }
  });
  expect_close(zero2_to_ddp[0], straight[0], 1e-5, "zero2 -> ddp");
  expect_close(ddp_to_zero1[0], straight[0], 1e-5, "ddp -> zero1");
  expect_close(ddp_to_zero1[1], ddp_to_zero1[0], 0.0, "ddp -> zero1, rank 1 against rank 0");

  // One process, batch 24: the samples both ranks took together.
  auto local_reference = copy_of(*initial);
  LocalStrategy reference(torch::nn::AnyModule(local_reference), with_optimizer(OptimizerKind::kAdam));
  auto one_process = [&](Strategy& s, int64_t first, int64_t steps) {
    for (int64_t k = first; k < first + steps; ++k) {
      s.forward_backward({{d.x.narrow(0, 24 * k, 24), d.y.narrow(0, 24 * k, 24), 1.0}}, cross_entropy);
      ASSERT_TRUE(s.step().stepped);
    }
  };
  one_process(reference, 0, 6);
  auto local = resumed(StrategyKind::kLocal, from_zero2, with_optimizer(OptimizerKind::kAdam));
  one_process(*local, 3, 3);
  expect_close(copies(local->module()), copies(*local_reference), 1e-5, "zero2 on 2 ranks -> local");
}

// bf16 autocast (O1): zero2 follows ddp closely. The forward runs in bf16 on weights that differ
// from ddp's by fp32 rounding, so bf16 roundings may flip: 1e-3, against steps of ~1e-2.
TEST(ZeroStrategy, Bf16AutocastFollowsDdp) {
  const Data d = random_data(96, 8);
  std::vector<torch::Tensor> ddp_final, zero_final;
  const auto initial = mlp(4);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    const StrategyOptions options = with_optimizer(OptimizerKind::kAdam).group(&group).opt_level(amp::OptLevel::kO1);
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
    ZeroStrategy zero2(torch::nn::AnyModule(model), with_optimizer(OptimizerKind::kSGD).group(&group), zero(2));
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
              HasSubstr("unknown strategy 'zero3'; choose local, ddp, dp, zero1, zero2, pipeline"));
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    const StrategyOptions o2 = with_optimizer(OptimizerKind::kAdam).group(&group).opt_level(amp::OptLevel::kO2);
    EXPECT_THAT(testing::error_message([&] { ZeroStrategy(model(), o2, ZeroOptions().stage(1)); }),
                HasSubstr("rank " + std::to_string(rank) +
                          ": the zero1 strategy trains at O0 (fp32) and O1 (autocast), not O2"));
    EXPECT_THAT(testing::error_message([&] { ZeroStrategy(model(), o2, ZeroOptions().stage(3)); }),
                HasSubstr("stage 3 is FSDP"));
  });
}

}  // namespace
}  // namespace lockstep::parallel
