#include "lockstep/parallel/pipeline_strategy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>

#include "../dist/multi_rank.h"
#include "lent_group.h"
#include "../test_util.h"
#include "lockstep/core/tensor_memory.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/zoo.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/local_strategy.h"
#include "lockstep/parallel/strategy_registry.h"
#include "lockstep/train/options.h"

namespace lockstep::parallel {
namespace {

using ::testing::HasSubstr;
using lockstep::testing::run_ranks;
namespace F = torch::nn::functional;

torch::Tensor cross_entropy(const torch::Tensor& out, const torch::Tensor& y) { return F::cross_entropy(out, y); }

StrategyOptions sgd() {
  const auto o = optim::OptimizerOptions(optim::OptimizerKind::kSGD, 0.1).momentum(0.9);
  return StrategyOptions().optimizer([o](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), o); });
}

// A model named `name` holding `weights` (a state dict): every rank and the reference start alike.
std::shared_ptr<models::Classifier> model_with(const std::string& name, const c10::Dict<std::string, torch::Tensor>& weights) {
  auto model = models::make_model(name);
  models::load_state_dict(*model, weights, "the test's initial weights");
  return model;
}

struct Batches {
  std::vector<torch::Tensor> x, y;  // per step: x (B, 1, 28, 28), y (B)
};

Batches random_batches(int64_t steps, int64_t batch) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  Batches b;
  for (int64_t s = 0; s < steps; ++s) {
    b.x.push_back(torch::randn({batch, 1, 28, 28}, gen));
    b.y.push_back(torch::randint(0, 10, {batch}, gen, torch::kInt64));
  }
  return b;
}

// The largest absolute difference between the tensors of two state dicts, key by key.
double max_difference(const c10::Dict<std::string, torch::Tensor>& a, const c10::Dict<std::string, torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (const auto& item : a)
    worst = std::max(worst, (item.value().to(torch::kDouble) - b.at(item.key()).to(torch::kDouble)).abs().max().item<double>());
  return worst;
}

TEST(PipelineSchedule, OneFOneBWarmsUpThenAlternatesAndGPipeRunsAllForwardsFirst) {
  using A = PipelineAction;
  const auto f = [](int64_t i) { return A{A::kForward, i}; };
  const auto b = [](int64_t i) { return A{A::kBackward, i}; };
  EXPECT_EQ(pipeline_schedule(PipelineSchedule::k1F1B, 0, 2, 4),
            (std::vector<A>{f(0), f(1), b(0), f(2), b(1), f(3), b(2), b(3)}));
  EXPECT_EQ(pipeline_schedule(PipelineSchedule::k1F1B, 1, 2, 4),
            (std::vector<A>{f(0), b(0), f(1), b(1), f(2), b(2), f(3), b(3)}));
  EXPECT_EQ(pipeline_schedule(PipelineSchedule::k1F1B, 0, 4, 2), (std::vector<A>{f(0), f(1), b(0), b(1)}));
  EXPECT_EQ(pipeline_schedule(PipelineSchedule::kGPipe, 1, 2, 3), (std::vector<A>{f(0), f(1), f(2), b(2), b(1), b(0)}));
  EXPECT_DOUBLE_EQ(bubble_fraction(2, 4), 0.2);
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 1), 0.75);
}

TEST(PipelineSchedule, BalancedSplitMinimisesTheLargestStage) {
  EXPECT_EQ(balanced_split({1, 1, 1, 10}, 2), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(balanced_split({5, 5, 5, 5}, 2), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(balanced_split({4, 1, 1, 1, 1, 4}, 3), (std::vector<int64_t>{1, 4, 1}));  // 4, 4, 4
  EXPECT_THAT(testing::error_message([] { balanced_split({1, 2}, 3); }), HasSubstr("3 pipeline stages but the model has only 2 blocks"));
}

// The reference a pipeline must match: one process that, for step s, accumulates the M
// micro-batches of each of the `replicas` batches s * replicas .. s * replicas + replicas - 1.
struct Reference {
  c10::Dict<std::string, torch::Tensor> weights;
  std::vector<double> losses;  // per step
};

Reference one_process(const std::string& model, const c10::Dict<std::string, torch::Tensor>& initial, const Batches& data,
                      int64_t steps, int64_t replicas, int64_t micro_batches) {
  LocalStrategy local(torch::nn::AnyModule(model_with(model, initial)), sgd());
  Reference r;
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<MicroBatch> micro;
    for (int64_t b = s * replicas; b < (s + 1) * replicas; ++b) {
      const auto xs = data.x[b].chunk(micro_batches), ys = data.y[b].chunk(micro_batches);
      for (int64_t i = 0; i < micro_batches; ++i)
        micro.push_back({xs[i], ys[i], 1.0 / static_cast<double>(micro_batches * replicas)});
    }
    r.losses.push_back(local.forward_backward(micro, cross_entropy));
    EXPECT_TRUE(local.step().stepped);
  }
  r.weights = local.model_state_dict();
  return r;
}

struct Case {
  std::string model;
  PipelineSchedule schedule;
};

class PipelineEquivalence : public ::testing::TestWithParam<Case> {};

// K = 2 stages on 2 ranks, M = 4 micro-batches, 2 optimizer steps of a 16-sample batch: the
// weights (and BatchNorm's running statistics) equal one process's that accumulates gradients
// over the same 4 micro-batches (the documented BatchNorm choice, Note [Pipeline strategy]), within
// 1e-5: fp32 sums in another order. The loss of each step equals the reference's on both ranks.
TEST_P(PipelineEquivalence, TwoStagesEqualOneProcessAccumulatingTheSameMicroBatches) {
  const Case c = GetParam();
  constexpr int64_t kSteps = 2, kBatch = 16, kMicro = 4;
  const Batches data = random_batches(kSteps, kBatch);
  torch::manual_seed(1);
  const auto initial = models::state_dict_to_dict(*models::make_model(c.model));
  const Reference expected = one_process(c.model, initial, data, kSteps, 1, kMicro);

  std::vector<c10::Dict<std::string, torch::Tensor>> finals(2);
  std::vector<std::vector<double>> losses(2);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    PipelineStrategy pipeline(torch::nn::AnyModule(model_with(c.model, initial)),
                              sgd().group(testing::lent(group)).pipeline(PipelineOptions().micro_batches(kMicro).schedule(c.schedule)));
    for (int64_t s = 0; s < kSteps; ++s) {
      losses[rank].push_back(pipeline.forward_backward({{data.x[s], data.y[s], 1.0}}, cross_entropy));
      ASSERT_TRUE(pipeline.step().stepped);
    }
    finals[rank] = pipeline.model_state_dict();
  });
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_LE(max_difference(finals[r], expected.weights), 1e-5) << "rank " << r;
    for (int64_t s = 0; s < kSteps; ++s) EXPECT_NEAR(losses[r][s], expected.losses[s], 1e-5) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Pipeline, PipelineEquivalence,
    ::testing::Values(Case{"mlp", PipelineSchedule::kGPipe}, Case{"mlp", PipelineSchedule::k1F1B},
                      Case{"convnet", PipelineSchedule::kGPipe}, Case{"convnet", PipelineSchedule::k1F1B}),
    [](const auto& info) { return info.param.model + "_" + pipeline_schedule_names()[static_cast<int>(info.param.schedule)]; });

// 2 stages x 2 replicas on 4 ranks (Note [Pipeline replicas]): replica r reads batch r of each
// step, 16 samples in M = 4 micro-batches; after 2 steps the parameters equal one process's that
// accumulates the 8 micro-batches of both replicas' batches (the 32-sample global batch), within
// 1e-5, on every rank. With BatchNorm (convnet) the parameters agree the same way; the running
// statistics are replica 0's, as DDP's broadcast_buffers leaves them, and are not compared.
TEST_P(PipelineEquivalence, TwoStagesTimesTwoReplicasEqualOneProcessOnTheGlobalBatch) {
  const Case c = GetParam();
  constexpr int64_t kSteps = 2, kBatch = 16, kMicro = 4, kReplicas = 2;
  const Batches data = random_batches(kSteps * kReplicas, kBatch);  // step s, replica r: batch s * 2 + r
  torch::manual_seed(1);
  const auto initial = models::state_dict_to_dict(*models::make_model(c.model));
  const Reference expected = one_process(c.model, initial, data, kSteps, kReplicas, kMicro);

  std::vector<c10::Dict<std::string, torch::Tensor>> finals(4);
  std::vector<std::vector<double>> losses(4);
  std::vector<int64_t> replicas(4);
  run_ranks(4, [&](int64_t rank, dist::ProcessGroup& group) {
    PipelineStrategy pipeline(
        torch::nn::AnyModule(model_with(c.model, initial)),
        sgd().group(testing::lent(group)).pipeline(PipelineOptions().stages(2).micro_batches(kMicro).schedule(c.schedule)));
    replicas[rank] = pipeline.replicas();
    const int64_t replica = rank / pipeline.ranks_per_replica();
    for (int64_t s = 0; s < kSteps; ++s) {
      losses[rank].push_back(
          pipeline.forward_backward({{data.x[s * kReplicas + replica], data.y[s * kReplicas + replica], 1.0}}, cross_entropy));
      ASSERT_TRUE(pipeline.step().stepped);
    }
    finals[rank] = pipeline.model_state_dict();
  });
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(replicas[r], 2);
    for (const auto& p : models::make_model(c.model)->named_parameters())
      EXPECT_LE((finals[r].at(p.key()) - expected.weights.at(p.key())).abs().max().item<double>(), 1e-5)
          << "rank " << r << ", " << p.key();
    for (int64_t s = 0; s < kSteps; ++s) EXPECT_NEAR(losses[r][s], expected.losses[s], 1e-5) << "rank " << r;
  }
}

// With K = 2 and M = 8, GPipe's first stage holds all 8 micro-batches' activations before its
// first backward; 1F1B's holds at most K = 2 (and the last stage 1). Counted by the strategy as
// it runs the step: forwards done whose backward has not run yet, and the tensor bytes those
// forwards left allocated (Note [Counting tensor bytes]; each rank's thread counts its own).
TEST(PipelineStrategy, OneFOneBHoldsFewerLiveActivationsThanGPipeAtEightMicroBatches) {
  const Batches data = random_batches(1, 64);
  std::map<PipelineSchedule, std::vector<int64_t>> peaks, bytes;
  TensorMemoryCounter counting;
  for (PipelineSchedule schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    peaks[schedule].resize(2);
    bytes[schedule].resize(2);
    run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
      PipelineStrategy pipeline(torch::nn::AnyModule(models::make_model("mlp")),
                                sgd().group(testing::lent(group)).pipeline(PipelineOptions().micro_batches(8).schedule(schedule)));
      pipeline.forward_backward({{data.x[0], data.y[0], 1.0}}, cross_entropy);
      peaks[schedule][rank] = pipeline.peak_live_micro_batches();
      bytes[schedule][rank] = pipeline.memory().activation_bytes;
    });
  }
  const auto& g = bytes[PipelineSchedule::kGPipe];
  const auto& f = bytes[PipelineSchedule::k1F1B];
  std::printf("at M=8, K=2, batch 64 (stage 0, stage 1): live micro-batches gpipe %lld, %lld; 1f1b %lld, %lld; "
              "activation bytes gpipe %lld, %lld; 1f1b %lld, %lld\n",
              static_cast<long long>(peaks[PipelineSchedule::kGPipe][0]), static_cast<long long>(peaks[PipelineSchedule::kGPipe][1]),
              static_cast<long long>(peaks[PipelineSchedule::k1F1B][0]), static_cast<long long>(peaks[PipelineSchedule::k1F1B][1]),
              static_cast<long long>(g[0]), static_cast<long long>(g[1]), static_cast<long long>(f[0]),
              static_cast<long long>(f[1]));
  EXPECT_EQ(peaks[PipelineSchedule::kGPipe], (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(peaks[PipelineSchedule::k1F1B], (std::vector<int64_t>{2, 1}));
  // Micro-batches are equal, so bytes scale with the count: 8 : 2 on stage 0, 8 : 1 on stage 1
  // (allowing a quarter for allocation order).
  EXPECT_GT(g[0], 0);
  EXPECT_NEAR(static_cast<double>(f[0]) / static_cast<double>(g[0]), 2.0 / 8.0, 0.25 * 2.0 / 8.0);
  EXPECT_NEAR(static_cast<double>(f[1]) / static_cast<double>(g[1]), 1.0 / 8.0, 0.25 * 1.0 / 8.0);
}

// A checkpoint of a pipelined run holds the whole model's optimizer state in one optimizer's
// numbering: after 2 steps it equals the local strategy's (momentum buffers within 1e-5); and a
// pipeline resumed from the local strategy's state steps exactly as the local strategy does.
TEST(PipelineStrategy, OptimizerStateMatchesOneProcessBothWays) {
  const Batches data = random_batches(3, 8);
  torch::manual_seed(2);
  const auto initial = models::state_dict_to_dict(*models::make_model("mlp"));
  auto reference = model_with("mlp", initial);
  LocalStrategy local(torch::nn::AnyModule(reference), sgd());
  for (int64_t s = 0; s < 2; ++s) {
    local.forward_backward({{data.x[s], data.y[s], 1.0}}, cross_entropy);
    local.step();
  }
  const auto local_weights = local.model_state_dict();
  const auto local_state = local.training_state_dict();
  c10::IValue gathered;
  std::vector<c10::Dict<std::string, torch::Tensor>> resumed(2);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    PipelineStrategy pipeline(torch::nn::AnyModule(model_with("mlp", initial)), sgd().group(testing::lent(group)));
    for (int64_t s = 0; s < 2; ++s) {
      pipeline.forward_backward({{data.x[s], data.y[s], 1.0}}, cross_entropy);
      pipeline.step();
    }
    const auto state = pipeline.training_state_dict();
    if (rank == 0) gathered = state.at("optimizer");
    PipelineStrategy from_local(torch::nn::AnyModule(model_with("mlp", local_weights)), sgd().group(testing::lent(group)));
    from_local.load_training_state_dict(local_state, "the local strategy's state");
    from_local.forward_backward({{data.x[2], data.y[2], 1.0}}, cross_entropy);
    from_local.step();
    resumed[rank] = from_local.model_state_dict();
  });
  const auto expected = local_state.at("optimizer").toGenericDict().at("state").toGenericDict();
  const auto got = gathered.toGenericDict().at("state").toGenericDict();
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& item : expected) {
    const torch::Tensor want = item.value().toGenericDict().at("momentum_buffer").toTensor();
    const torch::Tensor have = got.at(item.key()).toGenericDict().at("momentum_buffer").toTensor();
    EXPECT_LE((want - have).abs().max().item<double>(), 1e-5) << "parameter " << item.key();
  }
  local.forward_backward({{data.x[2], data.y[2], 1.0}}, cross_entropy);
  local.step();
  for (int64_t r = 0; r < 2; ++r) EXPECT_LE(max_difference(resumed[r], local.model_state_dict()), 1e-5) << "rank " << r;
}

// Bad configurations fail before training, naming the values and the fix.
TEST(PipelineStrategy, BadConfigurationsFailBeforeTraining) {
  EXPECT_THAT(testing::error_message([] {
                PipelineStrategy(torch::nn::AnyModule(models::make_model("mlp")), sgd().pipeline(PipelineOptions().stages(3)));
              }),
              HasSubstr("PipelineOptions::stages 3 is more than the model's 2 blocks (fc1, fc2)"));
  EXPECT_THAT(testing::error_message([] {
                PipelineStrategy(torch::nn::AnyModule(models::make_model("convnet")),
                                 sgd().pipeline(PipelineOptions().stages(1).split({2, 2})));
              }),
              HasSubstr("PipelineOptions::split 2,2 has 2 entries for 1 stages"));
  EXPECT_THAT(testing::error_message([] {
                train::TrainOptions o;
                o.trainer().strategy(StrategyKind::kPipeline).batch_size(4).strategy_options().pipeline().micro_batches(8);
                o.validate();
              }),
              HasSubstr("--micro-batches 8 is larger than the batch (--batch-size 4)"));
  std::vector<std::string> messages(3);
  run_ranks(3, [&](int64_t rank, dist::ProcessGroup& group) {
    messages[rank] = testing::error_message([&] {
      PipelineStrategy(torch::nn::AnyModule(models::make_model("convnet")), sgd().group(testing::lent(group)).pipeline(PipelineOptions().stages(2)));
    });
  });
  for (int64_t r = 0; r < 3; ++r)
    EXPECT_THAT(messages[r], HasSubstr("rank " + std::to_string(r) + ": the world size 3 is not divisible by PipelineOptions::stages 2"));
}

}  // namespace
}  // namespace lockstep::parallel
