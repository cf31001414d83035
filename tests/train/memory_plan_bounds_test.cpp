// A memory plan's bounds (issue 54): plans of many ranks are one entry per group of ranks that
// hold the same (Note [Plans of many ranks]), worlds past the largest job and models whose
// parameters cannot fit are refused before anything is built (Note [Refusing absurd shapes]).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>

#include "lockstep/core/world.h"
#include "lockstep/models/gpt_mini.h"
#include "lockstep/train/memory_plan.h"

namespace lockstep {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

train::TrainOptions synthetic_run(const std::string& model, parallel::StrategyKind kind, int64_t batch) {
  train::TrainOptions o;
  o.model(model).data(train::DataSource::kSynthetic).limit(64);
  o.trainer().strategy(kind).batch_size(batch);
  return o;
}

train::TrainOptions gpt_mini_run() {
  train::TrainOptions o;
  o.model("gpt-mini").data(train::DataSource::kText).text_file("/nonexistent/corpus.txt");
  return o;
}

// 10^6 ranks of ddp hold the same: one entry of 10^6 ranks, one line of the table, one JSON
// entry, planned in the time of one rank. Before: a RankMemory and a line per rank (10^6 lines),
// and 10^9 ranks ran past 60 s and 2.3-7 GB.
TEST(MemoryPlanBounds, AMillionRanksOfDdpAreOneEntryPlannedAndPrintedOnce) {
  const train::TrainOptions o = synthetic_run("mlp", parallel::StrategyKind::kDdp, 8);
  const auto start = Clock::now();
  const train::MemoryPlan plan =
      train::plan_memory(o, train::MemoryPlanOptions().world_size(1'000'000).local_ranks(8).evaluation(false));
  EXPECT_LT(seconds_since(start), 10.0);  // the dry runs of one rank, on a loaded host
  ASSERT_EQ(plan.ranks.size(), 1u);
  EXPECT_EQ(plan.ranks[0].count, 1'000'000);
  EXPECT_EQ(plan.ranks[0].which_ranks(), "ranks 0-999999");
  const std::string table = plan.table();
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 1) << table;
  EXPECT_THAT(table, ::testing::StartsWith("ranks 0-999999: parameters "));
  const auto json = plan.to_json();
  ASSERT_EQ(json["ranks"].size(), 1u);
  EXPECT_EQ(json["ranks"][0]["count"], 1'000'000);
  EXPECT_EQ(plan.of_rank(999'999).rank, 999'999);
  EXPECT_EQ(plan.of_rank(999'999).peak(), plan.ranks[0].peak());
  EXPECT_THROW(plan.of_rank(1'000'000), c10::ValueError);
}

// A pipeline's ranks of one stage hold the same: 6 ranks of 3 stages are 3 entries of 2 ranks
// each, rank r in stage r mod 3.
TEST(MemoryPlanBounds, APipelinesRanksAreGroupedByStage) {
  train::TrainOptions o = synthetic_run("mlp-wide", parallel::StrategyKind::kPipeline, 8);
  o.trainer().strategy_options().pipeline().stages(3);
  const train::MemoryPlan plan = train::plan_memory(o, train::MemoryPlanOptions().world_size(6).evaluation(false));
  ASSERT_EQ(plan.ranks.size(), 3u);
  for (int64_t s = 0; s < 3; ++s) {
    EXPECT_EQ(plan.ranks[s].rank, s);
    EXPECT_EQ(plan.ranks[s].count, 2);
    EXPECT_EQ(plan.ranks[s].stride, 3);
    EXPECT_EQ(plan.ranks[s].stage, s);
  }
  EXPECT_EQ(plan.ranks[1].which_ranks(), "ranks 1, 4");
  EXPECT_EQ(plan.of_rank(4).stage, 1);
  EXPECT_EQ(plan.of_rank(4).parameters, plan.ranks[1].parameters);
  train::RankMemory many;
  many.rank = 1, many.count = 512, many.stride = 2;
  EXPECT_EQ(many.which_ranks(), "ranks 1, 3, ..., 1023 (512 ranks)");
}

// Past kPlanTableEntries entries the table prints the first and the last halves and a line for
// those between.
TEST(MemoryPlanBounds, TheTableListsAtMostItsBoundOfEntries) {
  train::MemoryPlan plan;
  plan.world_size = 100;
  for (int64_t r = 0; r < 100; ++r) {
    train::RankMemory m;
    m.rank = m.stage = r;
    m.stride = 100;
    plan.ranks.push_back(m);
  }
  const std::string table = plan.table();
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), train::kPlanTableEntries + 1) << table;
  EXPECT_THAT(table, HasSubstr("\n... 84 more entries, stages 8-91 (the JSON form lists each)\nrank 92 (stage 92): "));
  EXPECT_EQ(plan.to_json()["ranks"].size(), 100u);
}

// The world of a plan is bounded as a job's is (kMaxWorldSize), and a host's ranks by the world,
// checked before the data or a model is built.
TEST(MemoryPlanBounds, WorldsPastTheLargestJobAreRefusedAtOnce) {
  EXPECT_THAT([] { train::MemoryPlanOptions().world_size(1'000'000'000).validate(); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr(
                  "MemoryPlanOptions::world_size 1000000000 is more ranks than lockstep runs (at most 1048576")));
  EXPECT_NO_THROW(train::MemoryPlanOptions().world_size(kMaxWorldSize).validate());
  EXPECT_THAT([] { train::MemoryPlanOptions().world_size(2).local_ranks(9'000'000'000'000'000'000).validate(); },
              ::testing::ThrowsMessage<c10::ValueError>(
                  HasSubstr("MemoryPlanOptions::local_ranks 9000000000000000000 must be between 0")));
}

// The count from gpt-mini's configuration equals the built module's parameters but its token
// embedding, to the element.
TEST(MemoryPlanBounds, GptMinisParametersAreCountedFromItsConfigurationExactly) {
  train::TrainOptions o = gpt_mini_run();
  o.max_length(40).n_layer(3).n_head(2).n_embd(24);
  const models::GptMini model(models::GptMiniOptions(50).context(40).layers(3).heads(2).d_model(24));
  int64_t built = 0;
  for (const auto& p : model->parameters()) built += p.numel();
  built -= model->wte->weight.numel();
  EXPECT_EQ(train::model_parameter_lower_bound(o), static_cast<double>(built));
  EXPECT_EQ(train::model_parameter_lower_bound(synthetic_run("resnet18", parallel::StrategyKind::kLocal, 8)), 0.0);
}

// A context of 10^9 tokens is a position table of 2.56 x 10^11 parameters (a terabyte): refused
// naming the settings, the count, the bytes, the limit and what to lower, before the corpus is
// read (it does not exist here) or a model built. Before: the plan built the model (5.8 GB, more
// than 60 s) or failed in LibTorch's allocator.
TEST(MemoryPlanBounds, AModelWhoseParametersCannotFitIsRefusedBeforeItIsBuilt) {
  train::TrainOptions o = gpt_mini_run();
  o.max_length(1'000'000'000);
  const train::MemoryLimit limit{int64_t{1} << 30, "a test's limit"};
  EXPECT_THAT([&] { train::check_model_size(o, {}, limit); },
              ::testing::ThrowsMessage<c10::ValueError>(AllOf(
                  HasSubstr("gpt-mini with TrainOptions::n_layer 4, TrainOptions::n_embd 256 and "
                            "TrainOptions::max_length 1000000000 has at least 256003159552 parameters"),
                  HasSubstr("the position table, max_length x n_embd: 256000000000; the 4 blocks: 3159040"),
                  HasSubstr("976574.6 MiB in fp32"), HasSubstr("more than the 1024.0 MiB each rank may use (a test's limit)"),
                  HasSubstr("Lower TrainOptions::max_length"))));
  o.max_length(128).n_embd(int64_t{1} << 40);  // 12 C^2 x 4 blocks: past 2^53, printed in powers of ten
  EXPECT_THAT([&] { train::check_model_size(o, {}, limit); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("has at least 5.8e+25 parameters")));
  o.n_embd(256);
  EXPECT_NO_THROW(train::check_model_size(o, {}, limit));  // the default gpt-mini: 3.2 million
  // The whole plan refuses as fast: with the machine's own memory, which holds no terabyte.
  o.max_length(1'000'000'000);
  const auto start = Clock::now();
  EXPECT_THAT([&] { train::plan_memory(o, {}); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("has at least 256003159552 parameters")));
  EXPECT_LT(seconds_since(start), 1.0);
}

// n_embd 2048 over 4 blocks is 201 million parameters: 769 MiB in fp32 fits a 1 GiB limit, but
// under local or ddp with SGD and momentum its parameters, gradients and momentum (2308 MiB) do
// not; fsdp on 4 ranks and zero2 on 16 fit. Refused before a corpus is read (it does not exist
// here) or a model built, with the other strategies' bounds. Before: the parameters alone were
// checked, and the plan went on to build the model (n_embd 8192 on a 24 GiB host: 12 GiB).
TEST(MemoryPlanBounds, AModelWhoseStatesCannotFitUnderItsStrategyIsRefusedBeforeItIsBuilt) {
  train::TrainOptions o = gpt_mini_run();
  o.n_embd(2048);  // lockstep train's SGD: momentum 0.9
  const train::MemoryLimit limit{int64_t{1} << 30, "a test's limit"};
  const double p = train::model_parameter_lower_bound(o);
  ASSERT_EQ(p, 128.0 * 2048 + 4 * (12.0 * 2048 * 2048 + 13 * 2048) + 2 * 2048);  // 201,699,328
  EXPECT_THAT([&] { train::check_model_size(o, {}, limit); },
              ::testing::ThrowsMessage<c10::ValueError>(AllOf(
                  HasSubstr("has at least 201699328 parameters"),
                  HasSubstr("under local at O0 on 1 rank each rank holds at least 2308.3 MiB of model states before "
                            "any activation (parameters 769.4, gradients 769.4, optimizer state 769.4 MiB), more than "
                            "the 1024.0 MiB it may use (a test's limit)"),
                  HasSubstr("more ranks under zero2 or fsdp share them"))));
  EXPECT_THAT([&] { train::check_model_size(o, train::MemoryPlanOptions().world_size(4), limit); },
              ::testing::ThrowsMessage<c10::ValueError>(AllOf(
                  HasSubstr("under ddp at O0 on 4 ranks each rank holds at least 2308.3 MiB"),
                  HasSubstr("Per rank on 4 ranks: zero1 at least 1731.2 MiB; zero2 at least 1154.1 MiB; fsdp at least "
                            "769.4 MiB"))));
  // Without momentum SGD keeps no state; Adam keeps two moments.
  o.momentum(0.0);
  EXPECT_THAT([&] { train::check_model_size(o, {}, limit); },
              ::testing::ThrowsMessage<c10::ValueError>(
                  HasSubstr("(parameters 769.4, gradients 769.4, optimizer state 0.0 MiB)")));
  o.momentum(std::nullopt).optimizer(optim::OptimizerOptions(optim::OptimizerKind::kAdam, 0.001));
  EXPECT_THAT([&] { train::check_model_size(o, {}, limit); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("optimizer state 1538.8 MiB")));
  // What shards enough fits: fsdp on 4 ranks holds the build's 769 MiB, zero2 with Adam on 16 ranks 914 MiB.
  o.trainer().strategy(parallel::StrategyKind::kFsdp);
  EXPECT_NO_THROW(train::check_model_size(o, train::MemoryPlanOptions().world_size(4), limit));
  o.trainer().strategy(parallel::StrategyKind::kZero2);
  EXPECT_NO_THROW(train::check_model_size(o, train::MemoryPlanOptions().world_size(16), limit));
  // The refusal is arithmetic and two stand-in optimizer steps: well under a second.
  o.trainer().strategy(parallel::StrategyKind::kLocal);
  const auto start = Clock::now();
  EXPECT_THROW(train::check_model_size(o, {}, limit), c10::ValueError);
  EXPECT_LT(seconds_since(start), 1.0);
}

}  // namespace
}  // namespace lockstep
