// gpt-mini through the pipeline: its token embedding is its first block's and, tied, its last
// block's weight (Note [Tied weights across stages]). Real ranks over Gloo, against one process.
#include "lockstep/parallel/pipeline_placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../dist/multi_rank.h"
#include "lent_group.h"
#include "lockstep/models/gpt_mini.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/local_strategy.h"
#include "lockstep/parallel/pipeline_strategy.h"

namespace lockstep::parallel {
namespace {

using lockstep::testing::run_ranks;
namespace F = torch::nn::functional;
using Weights = c10::Dict<std::string, torch::Tensor>;

// 2 layers, d 16, vocabulary 40, context 8: blocks embed, h.0, h.1, head; a step takes milliseconds.
models::GptMiniOptions tiny() { return models::GptMiniOptions(40).context(8).d_model(16).heads(2).layers(2); }

// logits (B, T, V), targets (B, T): the mean next-token loss over every position.
torch::Tensor lm_loss(const torch::Tensor& out, const torch::Tensor& y) {
  return F::cross_entropy(out.flatten(0, 1), y.flatten());
}

StrategyOptions sgd(double clip_norm = 0.0) {
  const auto o = optim::OptimizerOptions(optim::OptimizerKind::kSGD, 0.1).momentum(0.9);
  return StrategyOptions().clip_norm(clip_norm).optimizer(
      [o](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), o); });
}

std::shared_ptr<models::GptMiniImpl> gpt(const Weights& weights, models::GptMiniOptions options = tiny()) {
  auto model = std::make_shared<models::GptMiniImpl>(options);
  models::load_state_dict(*model, weights, "the test's initial weights");
  return model;
}

Weights initial_weights() {
  torch::manual_seed(1);
  return models::state_dict_to_dict(*std::make_shared<models::GptMiniImpl>(tiny()));
}

struct Batches {
  std::vector<torch::Tensor> x, y;  // per batch: token ids (16, 8), next tokens (16, 8)
};

Batches random_batches(int64_t count) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  Batches b;
  for (int64_t i = 0; i < count; ++i) {
    b.x.push_back(torch::randint(0, 40, {16, 8}, gen, torch::kInt64));
    b.y.push_back(torch::randint(0, 40, {16, 8}, gen, torch::kInt64));
  }
  return b;
}

struct Reference {
  Weights weights;
  std::vector<double> losses;  // per step
};

// One process that, for step s, accumulates the M micro-batches of each of the `replicas`
// batches s * replicas .. s * replicas + replicas - 1: the global batch of a pipelined step.
Reference one_process(const Weights& initial, const Batches& data, int64_t steps, int64_t replicas, int64_t micro,
                      double clip_norm = 0.0) {
  LocalStrategy local(torch::nn::AnyModule(gpt(initial)), sgd(clip_norm));
  Reference r;
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<MicroBatch> micro_batches;
    for (int64_t b = s * replicas; b < (s + 1) * replicas; ++b) {
      const auto xs = data.x[b].chunk(micro), ys = data.y[b].chunk(micro);
      for (int64_t i = 0; i < micro; ++i) micro_batches.push_back({xs[i], ys[i], 1.0 / static_cast<double>(micro * replicas)});
    }
    r.losses.push_back(local.forward_backward(micro_batches, lm_loss));
    EXPECT_TRUE(local.step().stepped);
  }
  r.weights = local.model_state_dict();
  return r;
}

double max_difference(const Weights& a, const Weights& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (const auto& item : a)
    worst = std::max(worst, (item.value().to(torch::kDouble) - b.at(item.key()).to(torch::kDouble)).abs().max().item<double>());
  return worst;
}

TEST(PipelinePlacement, TheTiedEmbeddingIsOwnedByTheFirstStageAndReplicatedOnTheLast) {
  models::GptMiniImpl model(tiny());
  const auto blocks = model.blocks();
  const auto params = model.parameters();  // wte, wpe, 12 per layer, ln_f weight and bias: 28
  ASSERT_EQ(params.size(), 28u);
  ASSERT_EQ(blocks.size(), 4u);

  const auto two = place_parameters(blocks, {0, 2, 4}, params);  // embed, h.0 | h.1, head
  ASSERT_EQ(two.size(), params.size());
  EXPECT_TRUE(two[0].parameter.is_same(model.wte->weight));
  EXPECT_EQ(two[0].stages, (std::vector<int64_t>{0, 1}));
  for (size_t i = 1; i < two.size(); ++i) EXPECT_EQ(two[i].stages.size(), 1u) << "parameter " << i;
  const StageParameters first = stage_parameters(two, 0), last = stage_parameters(two, 1);
  EXPECT_EQ(first.owned.size(), 14u);
  EXPECT_EQ(first.first_owned, 0);
  EXPECT_TRUE(first.tied.empty());
  EXPECT_EQ(last.owned.size(), 14u);
  EXPECT_EQ(last.first_owned, 14);
  ASSERT_EQ(last.tied.size(), 1u);
  EXPECT_TRUE(last.tied[0].is_same(model.wte->weight));
  std::vector<int64_t> numbers;
  for (int64_t j = 14; j < 28; ++j) numbers.push_back(j);
  numbers.push_back(0);  // the replica keeps its owner's number
  EXPECT_EQ(last.model_indices(), numbers);

  // One stage, or the untied model, or the classifier (whose head does not use wte): nothing tied.
  for (const auto& p : place_parameters(blocks, {0, 4}, params)) EXPECT_EQ(p.stages.size(), 1u);
  TiedGradients none(place_parameters(blocks, {0, 4}, params), 1, nullptr);
  EXPECT_EQ(none.count(), 0);
  for (const auto& options : {tiny().tie_embeddings(false), tiny().num_classes(3)}) {
    models::GptMiniImpl other(options);
    for (const auto& p : place_parameters(other.blocks(), {0, 2, 4}, other.parameters())) EXPECT_EQ(p.stages.size(), 1u);
  }
}

struct Case {
  int64_t stages, replicas;
  std::vector<int64_t> split;  // empty: balanced
  PipelineSchedule schedule;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.stages << " stages x " << c.replicas << " replicas, " << pipeline_schedule_names()[static_cast<int>(c.schedule)];
}

class TiedPipeline : public ::testing::TestWithParam<Case> {};

// K stages x R replicas, M = 4 micro-batches of 16-sequence batches (replica r reads batch r of
// each step), 3 optimizer steps: every rank's whole model equals one process's on the global batch
// within 1e-5 (fp32 sums in another order), and so does each step's loss. The stages that hold wte
// hold the same values bit for bit (each rank's own copy, before anything brings the model
// together): its gradient is summed across them (Note [Tied weights across stages]).
TEST_P(TiedPipeline, EqualsOneProcessOnTheGlobalBatchWithTheTiedEmbeddingIdenticalOnItsStages) {
  const Case c = GetParam();
  constexpr int64_t kSteps = 3, kMicro = 4;
  const int64_t world = c.stages * c.replicas;
  const Batches data = random_batches(kSteps * c.replicas);  // step s, replica r: batch s * R + r
  const Weights initial = initial_weights();
  const Reference expected = one_process(initial, data, kSteps, c.replicas, kMicro);

  std::vector<Weights> finals(world);
  std::vector<torch::Tensor> own_wte(world);
  std::vector<std::vector<double>> losses(world);
  std::vector<int64_t> tied(world);
  run_ranks(world, [&](int64_t rank, dist::ProcessGroup& group) {
    auto model = gpt(initial);
    PipelineStrategy pipeline(torch::nn::AnyModule(model),
                              sgd().group(testing::lent(group)).pipeline(PipelineOptions().stages(c.stages).micro_batches(kMicro)
                                                               .schedule(c.schedule).split(c.split)));
    const int64_t replica = rank / c.stages;
    for (int64_t s = 0; s < kSteps; ++s) {
      const int64_t b = s * c.replicas + replica;
      losses[rank].push_back(pipeline.forward_backward({{data.x[b], data.y[b], 1.0}}, lm_loss));
      ASSERT_TRUE(pipeline.step().stepped);
    }
    own_wte[rank] = model->wte->weight.detach().clone();
    finals[rank] = pipeline.model_state_dict();
  }, std::chrono::seconds(30));
  for (int64_t r = 0; r < world; ++r) {
    EXPECT_LE(max_difference(finals[r], expected.weights), 1e-5) << "rank " << r;
    for (int64_t s = 0; s < kSteps; ++s) EXPECT_NEAR(losses[r][s], expected.losses[s], 1e-5) << "rank " << r;
    EXPECT_FALSE(finals[r].contains("lm_head.weight"));
  }
  for (int64_t replica = 0; replica < c.replicas; ++replica) {
    const torch::Tensor& first = own_wte[replica * c.stages];
    const torch::Tensor& last = own_wte[replica * c.stages + c.stages - 1];
    EXPECT_TRUE(torch::equal(first, last)) << "replica " << replica << ": wte on its first and last stage";
    EXPECT_LE((first - expected.weights.at("wte.weight")).abs().max().item<double>(), 1e-5) << "replica " << replica;
  }
}

INSTANTIATE_TEST_SUITE_P(
    GptMini, TiedPipeline,
    ::testing::Values(Case{2, 1, {}, PipelineSchedule::kGPipe}, Case{2, 1, {}, PipelineSchedule::k1F1B},
                      Case{2, 2, {}, PipelineSchedule::kGPipe}, Case{2, 2, {}, PipelineSchedule::k1F1B},
                      Case{3, 1, {1, 2, 1}, PipelineSchedule::kGPipe}, Case{3, 1, {1, 2, 1}, PipelineSchedule::k1F1B},
                      Case{4, 1, {}, PipelineSchedule::k1F1B}, Case{1, 2, {}, PipelineSchedule::kGPipe}),
    [](const auto& info) {
      const Case& c = info.param;
      return std::to_string(c.stages) + "_stages_x" + std::to_string(c.replicas) + "_" +
             pipeline_schedule_names()[static_cast<int>(c.schedule)];
    });

// Clipping by norm counts the tied gradient once: with --clip-norm 0.05 (well under the gradients'
// norm, so every step is scaled) 2 stages end where one process clipping the same way ends.
TEST(TiedPipeline, ClippingByNormCountsTheTiedGradientOnce) {
  constexpr int64_t kSteps = 2, kMicro = 4;
  constexpr double kClip = 0.05;
  const Batches data = random_batches(kSteps);
  const Weights initial = initial_weights();
  const Reference expected = one_process(initial, data, kSteps, 1, kMicro, kClip);
  const Reference unclipped = one_process(initial, data, kSteps, 1, kMicro);
  ASSERT_GT(max_difference(expected.weights, unclipped.weights), 1e-3) << "the clip must bite for the test to mean anything";
  std::vector<Weights> finals(2);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    PipelineStrategy pipeline(torch::nn::AnyModule(gpt(initial)),
                              sgd(kClip).group(testing::lent(group)).pipeline(PipelineOptions().micro_batches(kMicro)));
    for (int64_t s = 0; s < kSteps; ++s) {
      pipeline.forward_backward({{data.x[s], data.y[s], 1.0}}, lm_loss);
      ASSERT_TRUE(pipeline.step().stepped);
    }
    finals[rank] = pipeline.model_state_dict();
  });
  for (int64_t r = 0; r < 2; ++r) EXPECT_LE(max_difference(finals[r], expected.weights), 1e-5) << "rank " << r;
}

// A pipelined checkpoint's optimizer state is one optimizer's over the whole model: as many
// entries as the model has parameters (wte once, at number 0), each momentum buffer equal to the
// local strategy's within 1e-5; and 2 stages loading the local strategy's state (the last stage's
// replica of wte takes number 0's) step as the local strategy does.
TEST(TiedPipeline, OptimizerStateIsTheWholeModelsBothWays) {
  const Batches data = random_batches(3);
  const Weights initial = initial_weights();
  LocalStrategy local(torch::nn::AnyModule(gpt(initial)), sgd());
  for (int64_t s = 0; s < 2; ++s) {
    local.forward_backward({{data.x[s], data.y[s], 1.0}}, lm_loss);
    local.step();
  }
  const Weights local_weights = local.model_state_dict();
  const auto local_state = local.training_state_dict();
  c10::IValue gathered;
  std::vector<Weights> resumed(2);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    PipelineStrategy pipeline(torch::nn::AnyModule(gpt(initial)), sgd().group(testing::lent(group)).pipeline(PipelineOptions().micro_batches(2)));
    for (int64_t s = 0; s < 2; ++s) {
      pipeline.forward_backward({{data.x[s], data.y[s], 1.0}}, lm_loss);
      pipeline.step();
    }
    const auto state = pipeline.training_state_dict();
    if (rank == 0) gathered = state.at("optimizer");
    PipelineStrategy from_local(torch::nn::AnyModule(gpt(local_weights)), sgd().group(testing::lent(group)));
    from_local.load_training_state_dict(local_state, "the local strategy's state");
    from_local.forward_backward({{data.x[2], data.y[2], 1.0}}, lm_loss);
    from_local.step();
    resumed[rank] = from_local.model_state_dict();
  });
  const auto expected = local_state.at("optimizer").toGenericDict().at("state").toGenericDict();
  const auto got = gathered.toGenericDict().at("state").toGenericDict();
  ASSERT_EQ(expected.size(), 28u);
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_EQ(gathered.toGenericDict().at("param_groups").toList().get(0).toGenericDict().at("params").toList().size(), 28u);
  for (const auto& item : expected) {
    const torch::Tensor want = item.value().toGenericDict().at("momentum_buffer").toTensor();
    const torch::Tensor have = got.at(item.key()).toGenericDict().at("momentum_buffer").toTensor();
    EXPECT_LE((want - have).abs().max().item<double>(), 1e-5) << "parameter " << item.key();
  }
  local.forward_backward({{data.x[2], data.y[2], 1.0}}, lm_loss);
  local.step();
  for (int64_t r = 0; r < 2; ++r) EXPECT_LE(max_difference(resumed[r], local.model_state_dict()), 1e-5) << "rank " << r;
}

// The untied model (lm_head) and the classifier (score) pipeline as before: 2 stages equal one process.
TEST(TiedPipeline, UntiedAndClassifierModelsStillEqualOneProcess) {
  const Batches data = random_batches(2);
  for (const auto& options : {tiny().tie_embeddings(false), tiny().num_classes(3)}) {
    const bool classify = options.num_classes() > 0;
    torch::manual_seed(3);
    const Weights initial = models::state_dict_to_dict(*std::make_shared<models::GptMiniImpl>(options));
    // classify: the class of each sequence, from its first token
    const auto target = [&](int64_t s) { return classify ? data.x[s].select(1, 0).remainder(3) : data.y[s]; };
    const LossFunction loss = classify ? LossFunction([](const torch::Tensor& out, const torch::Tensor& y) {
      return F::cross_entropy(out, y);
    }) : LossFunction(lm_loss);
    LocalStrategy local(torch::nn::AnyModule(gpt(initial, options)), sgd());
    for (int64_t s = 0; s < 2; ++s) {
      const auto xs = data.x[s].chunk(4), ys = target(s).chunk(4);
      std::vector<MicroBatch> micro;
      for (int64_t i = 0; i < 4; ++i) micro.push_back({xs[i], ys[i], 0.25});
      local.forward_backward(micro, loss);
      local.step();
    }
    std::vector<Weights> finals(2);
    run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
      PipelineStrategy pipeline(torch::nn::AnyModule(gpt(initial, options)),
                                sgd().group(testing::lent(group)).pipeline(PipelineOptions().micro_batches(4)));
      for (int64_t s = 0; s < 2; ++s) {
        pipeline.forward_backward({{data.x[s], target(s), 1.0}}, loss);
        pipeline.step();
      }
      finals[rank] = pipeline.model_state_dict();
    });
    for (int64_t r = 0; r < 2; ++r)
      EXPECT_LE(max_difference(finals[r], local.model_state_dict()), 1e-5) << (classify ? "classify" : "untied") << ", rank " << r;
  }
}

}  // namespace
}  // namespace lockstep::parallel
