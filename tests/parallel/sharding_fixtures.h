// What the sharded strategies' tests share: an mlp, random data, a few steps on a rank, and
// checkpoints moved between strategies.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/models/mlp.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/ddp_strategy.h"
#include "lockstep/parallel/local_strategy.h"
#include "lockstep/parallel/strategy.h"
#include "lockstep/parallel/strategy_registry.h"
#include "../dist/multi_rank.h"
#include "lent_group.h"

namespace lockstep::parallel::sharding_test {

namespace F = torch::nn::functional;
using optim::OptimizerKind;

inline torch::Tensor cross_entropy(const torch::Tensor& out, const torch::Tensor& y) { return F::cross_entropy(out, y); }

inline StrategyOptions with_optimizer(OptimizerKind kind) {
  const optim::OptimizerOptions o =
      optim::OptimizerOptions(kind, kind == OptimizerKind::kSGD ? 0.1 : 0.01)
          .momentum(kind == OptimizerKind::kSGD ? 0.9 : 0.0);
  return StrategyOptions().optimizer(
      [o](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), o); });
}

struct Data {
  torch::Tensor x, y;  // x (N, 1, 28, 28), y (N)
};

inline Data random_data(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {torch::randn({n, 1, 28, 28}, gen), torch::randint(0, 10, {n}, gen, torch::kInt64)};
}

// Initial weights are drawn on the test's thread: rank threads share the global generator, so
// models they seeded and built at the same time would interleave its draws.
inline std::shared_ptr<models::MLPImpl> mlp(uint64_t seed) {
  torch::manual_seed(seed);
  return std::make_shared<models::MLPImpl>();
}

// A new mlp holding `from`'s weights, plus `offset` (a rank's weights that differ from rank 0's).
inline std::shared_ptr<models::MLPImpl> copy_of(const models::MLPImpl& from, double offset = 0.0) {
  auto m = std::make_shared<models::MLPImpl>();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < m->parameters().size(); ++i) m->parameters()[i].copy_(from.parameters()[i] + offset);
  return m;
}

// `steps` optimizer steps from step `first` on; step k on rank `rank` takes 3 micro-batches of 4
// samples (weights 1/3) or, without accumulation, one of 12, from a rank-specific range of `d`.
inline void train(Strategy& strategy, const Data& d, int64_t first, int64_t steps, int64_t rank, bool accumulate) {
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

// `steps` steps in one process on the samples both ranks of train() take together: 24 per step.
inline void train_one_process(Strategy& strategy, const Data& d, int64_t first, int64_t steps) {
  for (int64_t k = first; k < first + steps; ++k) {
    strategy.forward_backward({{d.x.narrow(0, 24 * k, 24), d.y.narrow(0, 24 * k, 24), 1.0}}, cross_entropy);
    ASSERT_TRUE(strategy.step().stepped) << strategy.name() << " step " << k;
  }
}

inline std::vector<torch::Tensor> copies(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

// The strategy's model_state_dict() values in order (collective: every rank calls it). The way to
// read fsdp's weights, which its module holds only while a unit is gathered.
inline std::vector<torch::Tensor> weights(Strategy& strategy) {
  std::vector<torch::Tensor> out;
  for (const auto& item : strategy.model_state_dict()) out.push_back(item.value());
  return out;
}

inline void expect_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, double tolerance,
                         const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_LE((a[i] - b[i]).abs().max().item<double>(), tolerance) << what << ", parameter " << i;
}

struct Saved {
  c10::Dict<std::string, torch::Tensor> model;
  c10::impl::GenericDict training{c10::StringType::get(), c10::AnyType::get()};
};

// A fresh strategy of `kind` over an mlp holding `saved`'s weights and training state.
inline std::unique_ptr<Strategy> resumed(StrategyKind kind, const Saved& saved, StrategyOptions options) {
  auto model = std::make_shared<models::MLPImpl>();
  models::load_state_dict(*model, saved.model, "saved model");
  auto s = make_strategy(kind, torch::nn::AnyModule(model), std::move(options));
  s->load_training_state_dict(saved.training, "saved state");
  return s;
}

// Builds the strategy under test over a model, with the options ddp gets.
using MakeStrategy = std::function<std::unique_ptr<Strategy>(torch::nn::AnyModule model, StrategyOptions options)>;

// The same model, data and seed through ddp and through `make`'s strategy on 2 real ranks end with
// the same parameters after 4 steps, on both ranks (rank 1's weights differ at first: both
// strategies start from rank 0's). 1e-5 in fp32: the gradient is averaged in another order
// (reduce-scatters of flat buckets against DDP's bucketed all-reduce), nothing else differs: the
// optimizers are element-wise. `accumulate_and_clip`: 3 micro-batches per step and clip_norm 0.05
// (every step clips).
inline void expect_matches_ddp(OptimizerKind optimizer, bool accumulate_and_clip, const MakeStrategy& make) {
  const Data d = random_data(120, 7);
  std::vector<std::vector<torch::Tensor>> ddp_final(2), sharded_final(2);
  const auto initial = mlp(11);
  lockstep::testing::run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    StrategyOptions options = with_optimizer(optimizer).group(testing::lent(group)).clip_norm(accumulate_and_clip ? 0.05 : 0.0);
    auto a = copy_of(*initial, 0.5 * rank);
    DdpStrategy ddp(torch::nn::AnyModule(a), options);
    auto sharded = make(torch::nn::AnyModule(copy_of(*initial, 0.5 * rank)), options);
    train(ddp, d, 0, 4, rank, accumulate_and_clip);
    train(*sharded, d, 0, 4, rank, accumulate_and_clip);
    ddp_final[rank] = copies(*a);
    sharded_final[rank] = weights(*sharded);
  });
  expect_close(sharded_final[0], ddp_final[0], 1e-5, "rank 0 against ddp");
  expect_close(sharded_final[1], sharded_final[0], 0.0, "rank 1 against rank 0");
}

// Checkpoints move between strategies: for each (first, second) of `pairs`, 3 Adam steps under
// `first` on 2 ranks, then its model and training state loaded into `second` and 3 more steps, end
// where 6 steps of ddp end (Adam's moments and step count must carry over; 1e-5, the gradients
// are summed in another order), the same on both ranks. The 2-rank state of the first pair
// resumes in one process (local, the double batch), ending where 6 local steps end.
inline void expect_resumes_like_ddp(const std::vector<std::pair<StrategyKind, StrategyKind>>& pairs) {
  const Data d = random_data(144, 5);
  std::vector<std::vector<torch::Tensor>> straight(2);
  std::vector<std::vector<std::vector<torch::Tensor>>> resumed_weights(pairs.size(), straight);
  Saved from_first_pair;
  const auto initial = mlp(3);
  lockstep::testing::run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    const StrategyOptions options = with_optimizer(OptimizerKind::kAdam).group(testing::lent(group));
    auto reference = copy_of(*initial);
    DdpStrategy ddp(torch::nn::AnyModule(reference), options);
    train(ddp, d, 0, 6, rank, false);
    straight[rank] = copies(*reference);
    for (size_t p = 0; p < pairs.size(); ++p) {
      Saved saved;
      {
        auto s = make_strategy(pairs[p].first, torch::nn::AnyModule(copy_of(*initial)), options);
        train(*s, d, 0, 3, rank, false);
        saved.model = s->model_state_dict();  // collective: every rank
        saved.training = s->training_state_dict();
      }
      auto s = resumed(pairs[p].second, saved, options);
      train(*s, d, 3, 3, rank, false);
      resumed_weights[p][rank] = weights(*s);
      if (p == 0 && rank == 0) from_first_pair = saved;
    }
  });
  for (size_t p = 0; p < pairs.size(); ++p) {
    const std::string what = to_string(pairs[p].first) + " -> " + to_string(pairs[p].second);
    expect_close(resumed_weights[p][0], straight[0], 1e-5, what);
    expect_close(resumed_weights[p][1], resumed_weights[p][0], 0.0, what + ", rank 1 against rank 0");
  }

  // One process, batch 24: the samples both ranks took together.
  auto local_reference = copy_of(*initial);
  LocalStrategy reference(torch::nn::AnyModule(local_reference), with_optimizer(OptimizerKind::kAdam));
  train_one_process(reference, d, 0, 6);
  auto local = resumed(StrategyKind::kLocal, from_first_pair, with_optimizer(OptimizerKind::kAdam));
  train_one_process(*local, d, 3, 3);
  expect_close(copies(local->module()), copies(*local_reference), 1e-5,
               to_string(pairs[0].first) + " on 2 ranks -> local");
}

}  // namespace lockstep::parallel::sharding_test
