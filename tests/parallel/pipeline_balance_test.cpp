#include "lockstep/parallel/pipeline_balance.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../dist/multi_rank.h"
#include "lent_group.h"
#include "../test_util.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/zoo.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/pipeline_strategy.h"
#include "lockstep/parallel/strategy_registry.h"
#include "lockstep/train/options.h"

namespace lockstep::parallel {
namespace {

using ::testing::HasSubstr;
using lockstep::testing::run_ranks;

// Parameters and time disagree: `slow` holds 4k parameters but runs its layer 400 times, `wide`
// and `out` hold 150k but run once. By parameters the cut is {slow, wide | out}; by time it is
// {slow | wide, out}, with a margin of about 10x in arithmetic.
struct SkewedImpl : models::Classifier {
  SkewedImpl() {
    slow = register_module("slow", torch::nn::Linear(64, 64));
    wide = register_module("wide", torch::nn::Linear(64, 2048));
    out = register_module("out", torch::nn::Linear(2048, 10));
  }
  std::vector<models::Block> blocks() override {
    auto s = slow.ptr(), w = wide.ptr(), o = out.ptr();
    return {{"slow", {s}, [s](const torch::Tensor& x) {
               torch::Tensor y = x;
               for (int i = 0; i < 400; ++i) y = torch::tanh(s->forward(y));
               return y;
             }},
            {"wide", {w}, [w](const torch::Tensor& x) { return torch::relu(w->forward(x)); }},
            {"out", {o}, [o](const torch::Tensor& x) { return o->forward(x); }}};
  }
  torch::nn::Linear slow{nullptr}, wide{nullptr}, out{nullptr};
};
TORCH_MODULE(Skewed);

std::vector<int64_t> parameter_counts(const std::vector<models::Block>& blocks) {
  std::vector<int64_t> sizes;
  for (const auto& b : blocks) {
    int64_t n = 0;
    for (const auto& p : models::block_parameters(b)) n += p.numel();
    sizes.push_back(n);
  }
  return sizes;
}

StrategyOptions sgd() {
  const auto o = optim::OptimizerOptions(optim::OptimizerKind::kSGD, 0.1).momentum(0.9);
  return StrategyOptions().optimizer([o](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), o); });
}

TEST(PipelineBalance, TheSlowBlockGetsAStageOfItsOwnWhereParameterCountsWouldNotGiveIt) {
  Skewed model;
  const auto blocks = model->blocks();
  EXPECT_EQ(balanced_split(parameter_counts(blocks), 2), (std::vector<int64_t>{2, 1}));
  const std::vector<int64_t> times = block_times_us(blocks, torch::randn({32, 64}));
  ASSERT_EQ(times.size(), 3u);
  EXPECT_GT(times[0], times[1] + times[2]) << times[0] << " us against " << times[1] << " + " << times[2];
  EXPECT_EQ(split_by_time(blocks, torch::randn({32, 64}), 2, nullptr), (std::vector<int64_t>{1, 2}));
}

// Timing runs forward and backward through every block; none of it may show in training:
// BatchNorm's running statistics, the gradients and the random numbers drawn next are as they
// were (Note [Balancing stages by time]).
TEST(PipelineBalance, TimingLeavesBuffersGradientsAndRandomNumbersAsTheyWere) {
  torch::manual_seed(3);
  auto model = models::make_model("convnet");
  model->train();
  const auto before = models::state_dict_to_dict(*model);
  const torch::Tensor input = torch::randn({8, 1, 28, 28});
  torch::manual_seed(5);
  const torch::Tensor expected = torch::rand({16});
  torch::manual_seed(5);
  block_times_us(model->blocks(), input);
  EXPECT_TRUE(torch::equal(torch::rand({16}), expected)) << "the timing drew from the generator";
  for (const auto& item : models::state_dict_to_dict(*model))
    EXPECT_TRUE(torch::equal(item.value(), before.at(item.key()))) << item.key() << " changed";
  for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
}

// Two stages on two ranks balanced by time: rank 0's measurement decides both ranks' cut, and the
// run ends with exactly the weights of the same cut given by hand (--split 1,2).
TEST(PipelineBalance, TwoRanksBalancedByTimeTrainExactlyAsTheSplitGivenByHand) {
  torch::manual_seed(7);
  const auto initial = models::state_dict_to_dict(*Skewed());
  const torch::Tensor x = torch::randn({16, 64}), y = torch::randint(0, 10, {16}, torch::kInt64);
  const auto loss = [](const torch::Tensor& out, const torch::Tensor& t) { return torch::nn::functional::cross_entropy(out, t); };
  const auto train = [&](PipelineOptions pipeline) {
    std::vector<c10::Dict<std::string, torch::Tensor>> finals(2);
    run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
      Skewed model;
      models::load_state_dict(*model, initial, "the test's initial weights");
      PipelineStrategy strategy(torch::nn::AnyModule(std::shared_ptr<models::Classifier>(model.ptr())), sgd().group(testing::lent(group)).pipeline(pipeline));
      for (int step = 0; step < 2; ++step) {
        strategy.forward_backward({{x, y, 1.0}}, loss);
        ASSERT_TRUE(strategy.step().stepped);
      }
      finals[rank] = strategy.model_state_dict();
    });
    return finals[0];
  };
  const auto by_time =
      train(PipelineOptions().micro_batches(4).balance(PipelineBalance::kTime).balance_input(x.narrow(0, 0, 4)));
  const auto by_hand = train(PipelineOptions().micro_batches(4).split({1, 2}));
  for (const auto& item : by_hand) EXPECT_TRUE(torch::equal(item.value(), by_time.at(item.key()))) << item.key();
}

TEST(PipelineBalance, BadConfigurationsFailBeforeTraining) {
  EXPECT_THAT(testing::error_message([] {
                train::TrainOptions o;
                o.trainer().strategy(StrategyKind::kPipeline).strategy_options().pipeline().split({1, 2})
                    .balance(PipelineBalance::kTime);
                o.validate();
              }),
              HasSubstr("--split 1,2 and --balance time both say where to cut the stages"));
  EXPECT_THAT(testing::error_message([] {
                train::TrainOptions o;
                o.trainer().strategy_options().pipeline().balance(PipelineBalance::kTime);
                o.validate();
              }),
              HasSubstr("--balance set a pipeline: add --strategy pipeline"));
  EXPECT_THAT(testing::error_message([] {
                PipelineStrategy(torch::nn::AnyModule(std::shared_ptr<models::Classifier>(Skewed().ptr())),
                                 sgd().pipeline(PipelineOptions().stages(2).balance(PipelineBalance::kTime)));
              }),
              HasSubstr("balancing pipeline stages by time needs an input"));
  EXPECT_THAT(testing::error_message([] { split_by_time(Skewed()->blocks(), torch::randn({2, 64}), 4, nullptr); }),
              HasSubstr("4 pipeline stages but the model has 3 blocks"));
}

}  // namespace
}  // namespace lockstep::parallel
