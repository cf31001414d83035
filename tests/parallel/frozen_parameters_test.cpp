// Frozen parameters (requires_grad false) under zero1, zero2 and fsdp: see Note [Frozen parameters].
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "../dist/multi_rank.h"
#include "../test_util.h"
#include "lockstep/models/classifier.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/ddp_strategy.h"
#include "lockstep/parallel/fsdp_strategy.h"
#include "lockstep/parallel/local_strategy.h"
#include "lockstep/parallel/sharded_state.h"
#include "lockstep/parallel/strategy_registry.h"
#include "lockstep/parallel/zero_strategy.h"
#include "sharding_fixtures.h"

namespace lockstep::parallel {
namespace {

using ::testing::HasSubstr;
using lockstep::testing::run_ranks;
using namespace sharding_test;  // NOLINT: the fixtures of these tests
using Weights = c10::Dict<std::string, torch::Tensor>;

// Flatten, Linear(784, 24), ReLU, Linear(24, 16), ReLU, Linear(16, 10), a backbone being
// fine-tuned: fc1 is frozen, and so is fc2.weight. Parameters in model order: 0 fc1.weight,
// 1 fc1.bias, 2 fc2.weight (frozen), 3 fc2.bias, 4 fc3.weight, 5 fc3.bias (training: 16 + 170 =
// 186 elements, shards of 93 on 2 ranks). Under fsdp the fc1 block is in no unit (all frozen),
// fc2 is a partly frozen unit and fc3 a trainable one.
class FrozenNetImpl : public models::Classifier {
 public:
  FrozenNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 24));
    fc2 = register_module("fc2", torch::nn::Linear(24, 16));
    fc3 = register_module("fc3", torch::nn::Linear(16, 10));
    for (auto& p : fc1->parameters()) p.requires_grad_(false);
    fc2->weight.requires_grad_(false);
  }
  std::vector<models::Block> blocks() override {
    auto l1 = fc1.ptr(), l2 = fc2.ptr(), l3 = fc3.ptr();
    return {{"fc1", {l1}, [l1](const torch::Tensor& x) { return torch::relu(l1->forward(x.flatten(1))); }},
            {"fc2", {l2}, [l2](const torch::Tensor& x) { return torch::relu(l2->forward(x)); }},
            {"fc3", {l3}, [l3](const torch::Tensor& x) { return l3->forward(x); }}};
  }

  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

const std::vector<std::string> kFrozen = {"fc1.weight", "fc1.bias", "fc2.weight"};
constexpr int64_t kFc1 = 784 * 24 + 24, kFc2Weight = 24 * 16, kFc2Bias = 16, kFc3 = 16 * 10 + 10;

bool is_frozen(const std::string& key) { return std::find(kFrozen.begin(), kFrozen.end(), key) != kFrozen.end(); }

// Drawn on the test's thread (see sharding_fixtures.h's mlp()).
std::shared_ptr<FrozenNetImpl> frozen_net(uint64_t seed) {
  torch::manual_seed(seed);
  return std::make_shared<FrozenNetImpl>();
}

std::shared_ptr<FrozenNetImpl> net_copy(const FrozenNetImpl& from) {
  auto m = std::make_shared<FrozenNetImpl>();
  models::load_state_dict(*m, models::state_dict_to_dict(from), "the initial net");
  return m;
}

Weights cloned(const Weights& weights) {
  Weights out;
  for (const auto& item : weights) out.insert(item.key(), item.value().clone());
  return out;
}

Weights weights_of(const FrozenNetImpl& net) { return cloned(models::state_dict_to_dict(net)); }

// SGD with momentum and weight decay, or AdamW with weight decay: either would move a frozen
// parameter that it stepped.
StrategyOptions frozen_options(OptimizerKind kind) {
  const optim::OptimizerOptions o = kind == OptimizerKind::kSGD
                                        ? optim::OptimizerOptions(kind, 0.1).momentum(0.9).weight_decay(0.05)
                                        : optim::OptimizerOptions(kind, 0.01).weight_decay(0.1);
  return StrategyOptions().optimizer(
      [o](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), o); });
}

// The largest difference over the trainable entries; frozen entries must equal `initial` bit
// for bit and every key must be there.
double check_weights(const Weights& actual, const Weights& expected, const Weights& initial, const std::string& what) {
  EXPECT_EQ(actual.size(), expected.size()) << what;
  double worst = 0.0;
  for (const auto& item : expected) {
    const auto it = actual.find(item.key());
    if (it == actual.end()) {
      ADD_FAILURE() << what << ": no '" << item.key() << "'";
      continue;
    }
    if (is_frozen(item.key())) {
      EXPECT_TRUE(torch::equal(it->value(), initial.at(item.key()))) << what << ": frozen '" << item.key()
                                                                     << "' changed";
      continue;
    }
    const double diff = (it->value() - item.value()).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5) << what << ": '" << item.key() << "'";
    worst = std::max(worst, diff);
  }
  return worst;
}

// PyTorch's numbering over all 6 parameters: params [0..5], state for 3, 4, 5 only; every state
// tensor within 1e-5 of `expected`'s. Returns the largest difference.
double check_optimizer_state(const c10::IValue& actual, const c10::IValue& expected, const std::string& what) {
  const auto groups = actual.toGenericDict().at("param_groups").toListRef();
  EXPECT_EQ(groups.size(), 1u) << what;
  EXPECT_EQ(groups[0].toGenericDict().at("params").toIntVector(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5})) << what;
  const auto state = actual.toGenericDict().at("state").toGenericDict();
  std::set<int64_t> numbers;
  for (const auto& item : state) numbers.insert(item.key().toInt());
  EXPECT_EQ(numbers, (std::set<int64_t>{3, 4, 5})) << what << ": frozen parameters 0, 1, 2 must have no state";
  double worst = 0.0;
  const auto want_state = expected.toGenericDict().at("state").toGenericDict();
  EXPECT_EQ(want_state.size(), 3u) << what << ": the reference";
  for (const auto& item : want_state) {
    const auto want = item.value().toGenericDict();
    const auto it = state.find(item.key());
    if (it == state.end()) continue;  // reported above
    const auto have = it->value().toGenericDict();
    EXPECT_EQ(have.size(), want.size()) << what << ", parameter " << item.key().toInt();
    for (const auto& entry : want) {
      const torch::Tensor w = entry.value().toTensor(), h = have.at(entry.key()).toTensor();
      EXPECT_EQ(h.sizes(), w.sizes()) << what << ", parameter " << item.key().toInt() << " " << entry.key().toStringRef();
      const double diff = (h.to(torch::kDouble) - w.to(torch::kDouble)).abs().max().item<double>();
      EXPECT_LE(diff, 1e-5) << what << ", parameter " << item.key().toInt() << " " << entry.key().toStringRef();
      worst = std::max(worst, diff);
    }
  }
  return worst;
}

std::unique_ptr<Strategy> make(StrategyKind kind, std::shared_ptr<FrozenNetImpl> net, StrategyOptions options) {
  return make_strategy(kind, torch::nn::AnyModule(std::move(net)), std::move(options));
}

struct Case {
  StrategyKind kind;
  OptimizerKind optimizer;
  bool accumulate_and_clip;  // 3 micro-batches per step and clip_norm 0.05 over the trainable gradients
  int64_t fsdp_min_params;   // fsdp: > 0 joins the blocks into one partly frozen unit
};

class ShardedStrategiesWithFrozenParameters : public ::testing::TestWithParam<Case> {};

// 4 steps on 2 real ranks against one process on the double batch: frozen parameters are bit for
// bit their initial values on both ranks, the trainable ones within 1e-5 of LocalStrategy's
// (the gradient is averaged in another order), and the consolidated optimizer state is
// LocalStrategy's, numbered over all 6 parameters.
TEST_P(ShardedStrategiesWithFrozenParameters, TrainAsOneProcessAndLeaveFrozenParametersUntouched) {
  const Case c = GetParam();
  const Data d = random_data(96, 21);
  const auto initial = frozen_net(5);
  const Weights start = weights_of(*initial);
  StrategyOptions options = frozen_options(c.optimizer).clip_norm(c.accumulate_and_clip ? 0.05 : 0.0);
  options.fsdp(FsdpOptions().min_params(c.fsdp_min_params));
  std::vector<Weights> sharded(2);
  std::vector<c10::IValue> sharded_state(2);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    StrategyOptions o = options;
    auto s = make(c.kind, net_copy(*initial), o.group(testing::lent(group)));
    train(*s, d, 0, 4, rank, c.accumulate_and_clip);
    sharded[rank] = s->model_state_dict();
    sharded_state[rank] = s->training_state_dict().at("optimizer");
  });
  LocalStrategy local(torch::nn::AnyModule(net_copy(*initial)), options);
  train_one_process(local, d, 0, 4);
  const Weights reference = local.model_state_dict();
  const c10::IValue reference_state = local.training_state_dict().at("optimizer");

  const std::string what = to_string(c.kind) + " " + optim::to_string(c.optimizer);
  const double weight_diff = check_weights(sharded[0], reference, start, what + " rank 0 against local");
  EXPECT_EQ(check_weights(sharded[1], sharded[0], start, what + " rank 1 against rank 0"), 0.0);
  EXPECT_GT((reference.at("fc3.weight") - start.at("fc3.weight")).abs().max().item<double>(), 1e-3)
      << "the trainable parameters must move for the comparison to mean anything";
  const double state_diff = check_optimizer_state(sharded_state[0], reference_state, what + " optimizer state");
  check_optimizer_state(sharded_state[1], reference_state, what + " rank 1 optimizer state");
  std::printf("[ measured ] %s%s%s: max |sharded - local| weights %.3g, optimizer state %.3g\n", what.c_str(),
              c.accumulate_and_clip ? " accumulation clip_norm" : "", c.fsdp_min_params > 0 ? " one unit" : "",
              weight_diff, state_diff);
}

INSTANTIATE_TEST_SUITE_P(
    Frozen, ShardedStrategiesWithFrozenParameters,
    ::testing::Values(Case{StrategyKind::kZero1, OptimizerKind::kSGD, false, 0},
                      Case{StrategyKind::kZero1, OptimizerKind::kAdamW, false, 0},
                      Case{StrategyKind::kZero2, OptimizerKind::kSGD, false, 0},
                      Case{StrategyKind::kZero2, OptimizerKind::kAdamW, false, 0},
                      Case{StrategyKind::kZero2, OptimizerKind::kSGD, true, 0},
                      Case{StrategyKind::kFsdp, OptimizerKind::kSGD, false, 0},
                      Case{StrategyKind::kFsdp, OptimizerKind::kAdamW, false, 0},
                      Case{StrategyKind::kFsdp, OptimizerKind::kAdamW, true, 0},
                      Case{StrategyKind::kFsdp, OptimizerKind::kSGD, false, 1000000}),
    [](const auto& info) {
      const Case& c = info.param;
      return to_string(c.kind) + "_" + optim::to_string(c.optimizer) +
             (c.accumulate_and_clip ? "_accumulation_clip_norm" : "") + (c.fsdp_min_params > 0 ? "_one_unit" : "");
    });

struct Saved {
  Weights model;
  c10::impl::GenericDict training{c10::StringType::get(), c10::AnyType::get()};
};

Saved save(Strategy& s) {
  Saved out;
  out.model = s.model_state_dict();  // collective: every rank
  out.training = s.training_state_dict();
  return out;
}

// A fresh net (other weights) holding `saved`'s weights and training state under `kind`.
std::unique_ptr<Strategy> resume(StrategyKind kind, const Saved& saved, StrategyOptions options) {
  auto net = std::make_shared<FrozenNetImpl>();
  models::load_state_dict(*net, saved.model, "saved model");
  auto s = make(kind, net, std::move(options));
  s->load_training_state_dict(saved.training, "saved state");
  return s;
}

// Full checkpoints with frozen parameters move between strategies and world sizes: 3 AdamW steps
// under one, its model_state_dict and training_state_dict loaded into another and 3 more steps,
// end within 1e-5 of 6 one-process steps (AdamW's moments and step count carry over; frozen
// parameters are in the saved model and come back bit for bit). zero2 -> ddp and ddp -> zero2
// on 2 ranks, local (1 process) -> zero2 and -> fsdp on 2 ranks, zero2's 2-rank state -> local.
TEST(ShardedStrategiesWithFrozenParameters, FullCheckpointsMoveBetweenZero2DdpFsdpAndLocal) {
  const Data d = random_data(144, 9);
  const auto initial = frozen_net(6);
  const Weights start = weights_of(*initial);
  const StrategyOptions options = frozen_options(OptimizerKind::kAdamW);
  LocalStrategy straight(torch::nn::AnyModule(net_copy(*initial)), options);
  train_one_process(straight, d, 0, 6);
  const Weights reference = straight.model_state_dict();
  Saved from_local;
  {
    LocalStrategy local(torch::nn::AnyModule(net_copy(*initial)), options);
    train_one_process(local, d, 0, 3);
    from_local = save(local);
  }
  for (const std::string& key : kFrozen) EXPECT_TRUE(torch::equal(from_local.model.at(key), start.at(key))) << key;

  const std::vector<std::pair<StrategyKind, StrategyKind>> pairs = {
      {StrategyKind::kZero2, StrategyKind::kDdp}, {StrategyKind::kDdp, StrategyKind::kZero2}};
  const std::vector<StrategyKind> from_one_process = {StrategyKind::kZero2, StrategyKind::kFsdp};
  std::vector<std::vector<Weights>> resumed(pairs.size() + from_one_process.size(), std::vector<Weights>(2));
  Saved from_zero2;
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    StrategyOptions o = options;
    o.group(testing::lent(group));
    for (size_t p = 0; p < pairs.size(); ++p) {
      Saved saved;
      {
        auto s = make(pairs[p].first, net_copy(*initial), o);
        train(*s, d, 0, 3, rank, false);
        saved = save(*s);
      }
      auto s = resume(pairs[p].second, saved, o);
      train(*s, d, 3, 3, rank, false);
      resumed[p][rank] = s->model_state_dict();
      if (p == 0 && rank == 0) from_zero2 = saved;
    }
    for (size_t k = 0; k < from_one_process.size(); ++k) {
      auto s = resume(from_one_process[k], from_local, o);
      train(*s, d, 3, 3, rank, false);
      resumed[pairs.size() + k][rank] = s->model_state_dict();
    }
  });
  for (size_t p = 0; p < resumed.size(); ++p) {
    const std::string what = p < pairs.size() ? to_string(pairs[p].first) + " -> " + to_string(pairs[p].second)
                                              : "local -> " + to_string(from_one_process[p - pairs.size()]);
    const double diff = check_weights(resumed[p][0], reference, start, what);
    EXPECT_EQ(check_weights(resumed[p][1], resumed[p][0], start, what + ", rank 1 against rank 0"), 0.0);
    std::printf("[ measured ] %s: max |resumed - local| %.3g\n", what.c_str(), diff);
  }

  for (const std::string& key : kFrozen) EXPECT_TRUE(torch::equal(from_zero2.model.at(key), start.at(key))) << key;
  const auto state = from_zero2.training.at("optimizer").toGenericDict().at("state").toGenericDict();
  EXPECT_FALSE(state.contains(0) || state.contains(1) || state.contains(2)) << "zero2 saved state for frozen ones";
  auto local = resume(StrategyKind::kLocal, from_zero2, options);
  train_one_process(*local, d, 3, 3);
  const double diff = check_weights(local->model_state_dict(), reference, start, "zero2 on 2 ranks -> local");
  std::printf("[ measured ] zero2 on 2 ranks -> local: max |resumed - local| %.3g\n", diff);
}

// The sharded form (--checkpoint-format sharded) with frozen parameters, under zero2 and fsdp:
// each rank's state, through a pickled round trip, holds the frozen parameters whole and the
// layouts' model indices; loaded into a fresh strategy over a differently initialised net it
// restores them bit for bit and trains on as 6 one-process steps do (1e-5); the N ranks' states
// reassembled give LocalStrategy's model and optimizer state after 3 steps, numbered over all 6
// parameters.
TEST(ShardedStrategiesWithFrozenParameters, ShardedStateRoundTripsAndReassembles) {
  const Data d = random_data(144, 10);
  const auto initial = frozen_net(7), other = frozen_net(8);
  const Weights start = weights_of(*initial);
  const StrategyOptions options = frozen_options(OptimizerKind::kAdamW);
  LocalStrategy straight(torch::nn::AnyModule(net_copy(*initial)), options);
  train_one_process(straight, d, 0, 3);
  const Weights after_three = cloned(straight.model_state_dict());  // it holds the live parameters
  const c10::IValue state_after_three = straight.training_state_dict().at("optimizer");
  train_one_process(straight, d, 3, 3);
  const Weights after_six = straight.model_state_dict();

  for (StrategyKind kind : {StrategyKind::kZero2, StrategyKind::kFsdp}) {
    const std::string what = to_string(kind);
    std::vector<ShardedState> states(2);
    std::vector<Weights> resumed(2);
    run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
      StrategyOptions o = options;
      o.group(testing::lent(group));
      {
        auto s = make(kind, net_copy(*initial), o);
        train(*s, d, 0, 3, rank, false);
        const std::vector<char> bytes = torch::pickle_save(sharded_state_to_dict(*s->sharded_state_dict()));
        states[rank] = sharded_state_from_dict(torch::pickle_load(bytes), what + " rank file");
      }
      auto s = make(kind, net_copy(*other), o);
      s->load_sharded_state_dict(states[rank], what + " rank file");
      train(*s, d, 3, 3, rank, false);
      resumed[rank] = s->model_state_dict();
    });
    for (int64_t rank : {0, 1}) {
      ASSERT_EQ(states[rank].frozen.size(), kFrozen.size()) << what;
      for (const std::string& key : kFrozen)
        EXPECT_TRUE(torch::equal(states[rank].frozen.at(key), start.at(key))) << what << " rank " << rank << " " << key;
      std::vector<int64_t> indices;
      for (const ShardLayout& l : states[rank].layouts) indices.insert(indices.end(), l.indices.begin(), l.indices.end());
      EXPECT_EQ(indices, (std::vector<int64_t>{3, 4, 5})) << what;
    }
    const double resumed_diff = check_weights(resumed[0], after_six, start, what + " resumed from its shards");
    EXPECT_EQ(check_weights(resumed[1], resumed[0], start, what + " resumed, rank 1 against rank 0"), 0.0);

    const ConsolidatedState full = consolidate_sharded_states(states, what + " rank files");
    const double model_diff = check_weights(full.model, after_three, start, what + " reassembled model");
    const double state_diff = check_optimizer_state(full.optimizer, state_after_three, what + " reassembled optimizer");
    std::printf("[ measured ] %s sharded: resumed %.3g, reassembled model %.3g, optimizer state %.3g\n", what.c_str(),
                resumed_diff, model_diff, state_diff);
  }
}

// What each rank holds with frozen parameters (AdamW, 2 ranks): ZeRO-2 and FSDP shard the 186
// trainable elements (93 per rank) and hold the frozen ones whole beside them; fsdp builds no unit
// for the all-frozen fc1 block, and resharding frees the trainable part of fc2 only.
TEST(ShardedStrategiesWithFrozenParameters, MemoryCountsFrozenParametersWholeAndUnitsHoldOnlyTrainableOnes) {
  const Data d = random_data(48, 11);
  const auto initial = frozen_net(3);
  std::vector<MemoryReport> reports(2);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    StrategyOptions o = frozen_options(OptimizerKind::kAdamW);
    o.group(testing::lent(group));
    ZeroStrategy zero2(torch::nn::AnyModule(net_copy(*initial)), o, ZeroOptions().stage(2));
    auto net = net_copy(*initial);
    FsdpStrategy fsdp(torch::nn::AnyModule(net), o);
    EXPECT_EQ(zero2.flat_parameters().indices(), (std::vector<int64_t>{3, 4, 5}));
    EXPECT_EQ(zero2.flat_parameters().model_param_count(), 6);
    ASSERT_EQ(fsdp.units().size(), 2u);
    EXPECT_EQ(fsdp.units()[0]->name(), "fc2");
    EXPECT_EQ(fsdp.units()[0]->flat().indices(), (std::vector<int64_t>{3}));
    EXPECT_EQ(fsdp.units()[1]->name(), "fc3");
    train(zero2, d, 0, 1, rank, false);
    train(fsdp, d, 0, 1, rank, false);
    EXPECT_FALSE(fsdp.units()[0]->gathered());
    EXPECT_EQ(fsdp.units()[0]->flat().flat().storage().nbytes(), 0u);
    EXPECT_EQ(net->fc2->weight.storage().nbytes(), 4u * kFc2Weight) << "a frozen weight was resharded";
    EXPECT_FALSE(net->fc2->weight.grad().defined());
    EXPECT_FALSE(net->fc1->weight.grad().defined());
    if (rank == 1) reports = {zero2.memory(), fsdp.memory()};
  });
  const int64_t frozen_bytes = 4 * (kFc1 + kFc2Weight), shard = (kFc2Bias + kFc3) / 2;
  EXPECT_EQ(reports[0].param_bytes, 4 * 2 * shard + frozen_bytes);
  EXPECT_EQ(reports[0].grad_bytes, 4 * shard);
  EXPECT_EQ(reports[0].optim_bytes, 8 * shard);
  // fsdp: its shards, both units gathered at once (prefetch: Note [FSDP prefetch]), the frozen whole.
  EXPECT_EQ(reports[1].param_bytes, 4 * (kFc2Bias / 2 + kFc3 / 2) + 4 * (kFc2Bias + kFc3) + frozen_bytes);
  EXPECT_EQ(reports[1].grad_bytes, 4 * shard);
  EXPECT_EQ(reports[1].optim_bytes, 8 * shard);
}

// O2 (bf16 model, fp32 masters) with clipping over the trainable gradients, one process: the
// frozen masters keep their values bit for bit, the model's bf16 copies stay their rounding, and
// the optimizer state numbers all 6 parameters with none for the frozen ones.
TEST(ShardedStrategiesWithFrozenParameters, O2MastersOfFrozenParametersNeverChange) {
  const Data d = random_data(96, 12);
  const auto initial = frozen_net(4);
  const Weights start = weights_of(*initial);
  auto net = net_copy(*initial);
  LocalStrategy o2(torch::nn::AnyModule(net),
                   frozen_options(OptimizerKind::kAdamW).opt_level(amp::OptLevel::kO2).clip_norm(0.05));
  train_one_process(o2, d, 0, 4);
  const Weights after = o2.model_state_dict();
  for (const std::string& key : kFrozen) EXPECT_TRUE(torch::equal(after.at(key), start.at(key))) << key;
  EXPECT_TRUE(torch::equal(net->fc1->weight, start.at("fc1.weight").to(torch::kBFloat16)));
  EXPECT_GT((after.at("fc3.weight") - start.at("fc3.weight")).abs().max().item<double>(), 1e-3);
  const auto state = o2.training_state_dict().at("optimizer").toGenericDict();
  EXPECT_EQ(state.at("state").toGenericDict().size(), 3u);
  EXPECT_FALSE(state.at("state").toGenericDict().contains(0));
  EXPECT_EQ(state.at("param_groups").toListRef()[0].toGenericDict().at("params").toList().size(), 6u);
}

// What is still refused says so with the rank and the fix: a trainable parameter that is not fp32,
// and a model with nothing to train.
TEST(ShardedStrategiesWithFrozenParameters, NonFp32TrainableOrAllFrozenIsRefusedNamingTheFix) {
  const auto initial = frozen_net(2);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    StrategyOptions o = frozen_options(OptimizerKind::kAdamW);
    o.group(testing::lent(group));
    auto bf16 = net_copy(*initial);
    bf16->fc3->to(torch::kBFloat16);
    bf16->fc1->to(torch::kBFloat16);  // frozen: any dtype is fine
    EXPECT_THAT(testing::error_message([&] { make(StrategyKind::kZero2, bf16, o); }),
                HasSubstr("rank " + std::to_string(rank) + ": parameter 'fc3.weight' is BFloat16; sharding needs fp32 "
                          "trainable parameters"));
    auto all_frozen = net_copy(*initial);
    for (auto& p : all_frozen->parameters()) p.requires_grad_(false);
    EXPECT_THAT(testing::error_message([&] { make(StrategyKind::kFsdp, all_frozen, o); }),
                HasSubstr("rank " + std::to_string(rank) + ": fsdp: the model has no trainable parameters to shard "
                          "(all 6 have requires_grad false)"));
    EXPECT_THAT(testing::error_message([&] { make(StrategyKind::kZero1, all_frozen, o); }),
                HasSubstr("the model has no trainable parameters to shard"));
  });
}

}  // namespace
}  // namespace lockstep::parallel
