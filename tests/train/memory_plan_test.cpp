// The memory plan (train/memory_plan.h): its model states against what the strategies report on
// real ranks, its activations against a counted step, and the limit it is checked against.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "../dist/multi_rank.h"
#include "../parallel/lent_group.h"
#include "../test_util.h"
#include "lockstep/core/tensor_memory.h"
#include "lockstep/models/zoo.h"
#include "lockstep/parallel/local_strategy.h"
#include "lockstep/parallel/shard_reducer.h"
#include "lockstep/parallel/strategy_registry.h"
#include "lockstep/train/memory_plan.h"
#include "../../src/train/memory_plan_layout.h"
#include "../../src/train/memory_probe.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

train::TrainOptions synthetic_run(const std::string& model, parallel::StrategyKind kind, int64_t batch) {
  train::TrainOptions o;
  o.model(model).data(train::DataSource::kSynthetic).limit(64);
  o.trainer().strategy(kind).batch_size(batch);
  return o;
}

// One step of `o`'s strategy on rank `rank` of `group`: what Strategy::memory() then reports.
parallel::MemoryReport strategy_memory(const train::TrainOptions& o, dist::ProcessGroup& group) {
  torch::manual_seed(0);
  auto model = models::make_model(o.model());
  auto strategy = parallel::make_strategy(*o.trainer().strategy(), torch::nn::AnyModule(model),
                                          o.strategy_options(testing::lent(group)).reporter([](ReportKind, const std::string&) {}));
  const auto shape = models::input_shape(o.model());
  std::vector<int64_t> input{o.trainer().batch_size()};
  input.insert(input.end(), shape.begin(), shape.end());
  const std::vector<parallel::MicroBatch> step{
      {torch::randn(input), torch::randint(10, {o.trainer().batch_size()}, torch::kInt64), 1.0}};
  strategy->forward_backward(step, [](const torch::Tensor& out, const torch::Tensor& target) {
    return torch::nn::functional::cross_entropy(out, target);
  });
  strategy->step();
  return strategy->memory();
}

// Parameters, gradients and optimizer state (with the fp32 masters, as MemoryReport lumps them)
// of every rank equal the strategy's own report after a step on two real ranks, to the byte.
TEST(MemoryPlan, ModelStatesEqualWhatEachStrategyReportsOnTwoRanks) {
  using parallel::StrategyKind;
  for (StrategyKind kind : {StrategyKind::kDdp, StrategyKind::kZero1, StrategyKind::kZero2, StrategyKind::kFsdp,
                            StrategyKind::kPipeline}) {
    SCOPED_TRACE(parallel::to_string(kind));
    train::TrainOptions o = synthetic_run("mlp", kind, 8);
    if (kind == StrategyKind::kZero2) o.optimizer().kind(optim::OptimizerKind::kAdam);
    const train::MemoryPlan plan = train::plan_memory(o, train::MemoryPlanOptions().world_size(2));
    // See Note [Plans of many ranks]: a pipeline's two stages are two entries, the others' ranks one.
    ASSERT_EQ(plan.ranks.size(), kind == StrategyKind::kPipeline ? 2u : 1u);
    std::vector<parallel::MemoryReport> reported(2);
    testing::run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) { reported[rank] = strategy_memory(o, group); });
    for (int64_t r = 0; r < 2; ++r) {
      const train::RankMemory m = plan.of_rank(r);
      EXPECT_EQ(m.parameters, reported[r].param_bytes) << "rank " << r;
      EXPECT_EQ(m.gradients, reported[r].grad_bytes) << "rank " << r;
      EXPECT_EQ(m.optimizer_state + m.masters, reported[r].optim_bytes) << "rank " << r;
    }
  }
}

// O2 keeps fp32 masters beside bf16 weights: the plan names them apart, and the local strategy's
// report (which lumps them with the optimizer state) agrees to the byte.
TEST(MemoryPlan, MastersAtO2AreTheFp32CopiesOfTheHalfWeights) {
  train::TrainOptions o = synthetic_run("convnet", parallel::StrategyKind::kLocal, 8);
  o.precision(train::Precision::kBf16).opt_level(amp::OptLevel::kO2);
  const train::RankMemory m = train::plan_memory(o, {}).ranks.at(0);
  int64_t fp32_bytes = 0;
  for (const auto& p : models::make_model("convnet")->parameters()) fp32_bytes += p.numel() * 4;
  EXPECT_GT(m.masters, 0);
  EXPECT_LE(m.masters, fp32_bytes);
  EXPECT_LT(m.parameters, fp32_bytes);  // bf16 weights, BatchNorm's kept in fp32
}

// The dry run's line through 4 and 8 rows predicts a counted step at 32 rows: the tensor bytes
// live at the step's peak (parameters, gradients, optimizer state, activations) within 5%.
TEST(MemoryPlan, ActivationsFromASmallDryRunPredictACountedStepAtFourTimesTheRows) {
  for (const char* name : {"convnet", "mlp-wide"}) {
    SCOPED_TRACE(name);
    train::TrainOptions o = synthetic_run(name, parallel::StrategyKind::kLocal, 32);
    const train::RankMemory m = train::plan_memory(o, train::MemoryPlanOptions().probe_rows(4)).ranks.at(0);
    const int64_t planned = m.steady - m.baseline - m.data;

    TensorMemoryCounter counter;
    torch::manual_seed(0);
    parallel::LocalStrategy local(torch::nn::AnyModule(models::make_model(name)),
                                  o.strategy_options(nullptr).reporter([](ReportKind, const std::string&) {}));
    const auto shape = models::input_shape(name);
    const std::vector<parallel::MicroBatch> step{{torch::randn({32, shape[0], shape[1], shape[2]}),
                                                  torch::randint(10, {32}, torch::kInt64), 1.0}};
    const auto loss = [](const torch::Tensor& out, const torch::Tensor& t) {
      return torch::nn::functional::cross_entropy(out, t);
    };
    local.forward_backward(step, loss);
    local.step();
    const int64_t before = TensorMemoryCounter::live_bytes() - parallel::tensor_bytes(step[0].input) -
                          parallel::tensor_bytes(step[0].target);
    TensorMemoryCounter::reset_peak();
    local.forward_backward(step, loss);
    local.step();
    const int64_t measured = before + TensorMemoryCounter::peak_bytes();
    EXPECT_NEAR(static_cast<double>(planned), static_cast<double>(measured), 0.05 * static_cast<double>(measured));
    EXPECT_GT(m.activations, 0);
  }
}

// Activation checkpointing keeps only the blocks' inputs: on resnet18, whose activations outweigh
// its weights, the plan holds fewer activation bytes (on mlp-wide, whose blocks' recompute costs
// more than their inputs save, it does not).
TEST(MemoryPlan, CheckpointingActivationsPlansFewerActivationBytesOnResnet18) {
  train::TrainOptions o = synthetic_run("resnet18", parallel::StrategyKind::kLocal, 8);
  const auto steps_only = train::MemoryPlanOptions().evaluation(false).probe_rows(2);
  const int64_t plain = train::plan_memory(o, steps_only).ranks.at(0).activations;
  o.trainer().checkpoint_activations(true);
  const train::RankMemory checkpointed = train::plan_memory(o, steps_only).ranks.at(0);
  EXPECT_LT(checkpointed.activations, plain);
  EXPECT_EQ(checkpointed.evaluation, 0);
}

// A refusal names the rank, the breakdown, the limit and where it came from, and what fits.
TEST(MemoryPlan, RefusalNamesTheRankTheBreakdownTheLimitAndWhatFits) {
  train::TrainOptions o = synthetic_run("mlp-wide", parallel::StrategyKind::kDdp, 16);
  const train::MemoryPlan ddp = train::plan_memory(o, train::MemoryPlanOptions().world_size(2));
  o.trainer().strategy(parallel::StrategyKind::kZero1);
  const train::MemoryPlan zero1 = train::plan_memory(o, train::MemoryPlanOptions().world_size(2));
  ASSERT_NE(zero1.largest().peak(), ddp.largest().peak());
  const bool zero1_smaller = zero1.largest().peak() < ddp.largest().peak();
  const train::MemoryPlan& big = zero1_smaller ? ddp : zero1;
  const train::MemoryPlan& small = zero1_smaller ? zero1 : ddp;
  const train::MemoryLimit limit{(big.largest().peak() + small.largest().peak()) / 2, "a test's limit"};
  const std::string refusal = train::memory_plan_refusal(big, limit, {small});
  EXPECT_THAT(refusal, HasSubstr("rank 0 of 2 would need"));
  EXPECT_THAT(refusal, HasSubstr("a test's limit"));
  EXPECT_THAT(refusal, HasSubstr("optimizer state"));
  EXPECT_THAT(refusal, HasSubstr(small.strategy + " needs " + train::format_mib(small.largest().peak()) + " MiB per rank"));
  EXPECT_THAT(refusal, HasSubstr("TrainOptions::ignore_memory_plan"));
  EXPECT_EQ(train::memory_plan_refusal(small, limit, {}), "");
}

// zero2 stages, reduce-scatters and all-gathers its buckets as ShardReducer closes them, which can
// pass the 25 MiB cap: mlp-wide's fc1 and fc2 (12.25 and 16 MiB) make one 28.3 MiB bucket. The
// plan's buffers are that bucket's staging, with the bucket a real reducer reports; on ranks of
// several hosts (over Gloo) also what reduce_scatter receives for it and its shard-sized sum, and
// Gloo's flat all-gather output. Ranks of one host share memory and need none of those (a bucket
// in flight beside the next needs two buckets: mlp-wide has one).
TEST(MemoryPlan, ZeroTwoPlansTheBucketsShardReducerCloses) {
  const train::TrainOptions o = synthetic_run("mlp-wide", parallel::StrategyKind::kZero2, 16);
  const train::MemoryPlan plan =
      train::plan_memory(o, train::MemoryPlanOptions().world_size(2).local_ranks(1).evaluation(false));
  const train::MemoryPlan one_host = train::plan_memory(o, train::MemoryPlanOptions().world_size(2).evaluation(false));
  std::vector<int64_t> bucket(2), flat_bytes(2);
  testing::run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    auto model = models::make_model("mlp-wide");
    const parallel::FlatParameters flat(*model, 2, rank);
    const parallel::ShardReducer reducer(flat, torch::zeros({flat.shard_numel()}), group, 25 << 20, nullptr);
    bucket[rank] = reducer.largest_bucket_bytes();
    flat_bytes[rank] = flat.padded_numel() * 4;
  });
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_GT(bucket[r], 25 << 20) << "rank " << r;
    EXPECT_EQ(plan.of_rank(r).buffers, 2 * bucket[r] + bucket[r] / 2 + flat_bytes[r]) << "rank " << r;
    EXPECT_EQ(one_host.of_rank(r).buffers, bucket[r]) << "rank " << r;
  }
}

// Through shared memory a bucket's reduce_scatter runs while the next bucket fills: two 28 MB
// buckets on two ranks hold the first's staging, its 14 MB part and the second's staging at once;
// a single bucket holds only itself (its part lands at the end of backward, counted beside it).
TEST(MemoryPlan, ABucketInFlightIsPlannedBesideTheNextOne) {
  const int64_t seven_m = 7'000'000;  // elements: 28 MB, over the 25 MiB cap alone
  EXPECT_EQ(train::buckets_in_flight_bytes({seven_m, seven_m}, 2 * seven_m, 2), 28'000'000 + 14'000'000 + 28'000'000);
  EXPECT_EQ(train::largest_bucket_bytes({seven_m, seven_m}, 2 * seven_m), 28'000'000);
  EXPECT_EQ(train::buckets_in_flight_bytes({1000, 24}, 1024, 2), 4096);
}

// zero2 holds, beside its bucket's staging, each parameter's gradient while backward copies it in,
// and the bucket's reduce-scatter output: mlp-wide's fc2 weight (4096 x 1024 fp32, 16 MiB) is the
// larger (its one 28.3 MiB bucket's shard on two ranks is 14.2 MiB). zero1 reduces its whole flat
// gradient instead. One dry run serves both plans, so the difference is exact.
TEST(MemoryPlan, ReducingIntoShardsHoldsTheLargestGradientBesideTheStaging) {
  train::TrainOptions o = synthetic_run("mlp-wide", parallel::StrategyKind::kZero2, 16);
  const train::ReferenceData data = train::make_image_data(o);
  train::ProcessMemory process;
  const auto two_ranks = train::MemoryPlanOptions().world_size(2).evaluation(false);
  const train::RankMemory zero2 = train::plan_with_data(o, two_ranks, data, process).ranks.at(0);
  o.trainer().strategy(parallel::StrategyKind::kZero1);
  const train::RankMemory zero1 = train::plan_with_data(o, two_ranks, data, process).ranks.at(0);
  EXPECT_EQ(zero2.activations - zero1.activations, int64_t{4096} * 1024 * 4);
}

// Ranks of one host copy their collectives through the group's shared-memory segment, a slot per
// rank and a result slot of 2 MiB, which mlp-wide's gradients fill, plus a page of control lines.
TEST(MemoryPlan, RanksOfOneHostHoldTheSharedMemorySegment) {
  const train::TrainOptions o = synthetic_run("mlp-wide", parallel::StrategyKind::kDdp, 16);
  const train::ReferenceData data = train::make_image_data(o);
  train::ProcessMemory process;
  const auto one_host = train::MemoryPlanOptions().world_size(2).evaluation(false);
  const auto two_hosts = train::MemoryPlanOptions(one_host).local_ranks(1);
  const train::RankMemory hosts = train::plan_with_data(o, two_hosts, data, process).ranks.at(0);
  const train::RankMemory host = train::plan_with_data(o, one_host, data, process).ranks.at(0);
  EXPECT_EQ(host.baseline - hosts.baseline, 3 * (int64_t{2} << 20) + 4096);
  EXPECT_EQ(host.steady - hosts.steady, host.baseline - hosts.baseline);
}

// The check at launch dry-runs a whole replica: a pipeline stage, which trains part of mlp-wide,
// plans at least a whole replica's weights and gradients at that moment; the lower bound of Note
// [Refusing fast] runs no step and has no such moment.
TEST(MemoryPlan, TheCheckAtLaunchHoldsAWholeReplica) {
  const train::TrainOptions o = synthetic_run("mlp-wide", parallel::StrategyKind::kPipeline, 16);
  const train::ReferenceData data = train::make_image_data(o);
  train::ProcessMemory process;
  const auto two_ranks = train::MemoryPlanOptions().world_size(2).evaluation(false);
  const train::MemoryPlan plan = train::plan_with_data(o, two_ranks, data, process);
  int64_t replica = 0;
  for (const auto& p : models::make_model("mlp-wide")->parameters()) replica += p.numel() * 4;
  for (const train::RankMemory& m : plan.ranks) {
    EXPECT_GE(m.launch_check, m.baseline + m.data + 2 * replica) << "rank " << m.rank;
    EXPECT_GE(m.peak(), m.launch_check) << "rank " << m.rank;
  }
  for (const train::RankMemory& m : train::plan_model_states(o, two_ranks, data, process).ranks)
    EXPECT_EQ(m.launch_check, 0) << "rank " << m.rank;
}

// ddp at bf16 O2 all-gathers its bf16 buckets (Gloo has no bf16 all-reduce): every bucket of
// mlp-wide (Linear layers only: all bf16) is held as N received copies plus Gloo's flat output at
// the end of backward, 2 x N x its bf16 parameters; fp32 buckets are all-reduced in place. A bucket
// rule that dropped or doubled a bucket would miss by 8 or 6 MiB.
TEST(MemoryPlan, DdpPlansItsBf16AllGathersAndNoneInFp32) {
  train::TrainOptions o = synthetic_run("mlp-wide", parallel::StrategyKind::kDdp, 16);
  const auto two_ranks = train::MemoryPlanOptions().world_size(2).evaluation(false);
  const train::RankMemory fp32 = train::plan_memory(o, two_ranks).ranks.at(0);
  EXPECT_EQ(fp32.collectives, 0);
  o.precision(train::Precision::kBf16).opt_level(amp::OptLevel::kO2);
  const train::RankMemory half = train::plan_memory(o, two_ranks).ranks.at(0);
  int64_t bf16_bytes = 0;
  for (const auto& p : models::make_model("mlp-wide")->parameters()) bf16_bytes += p.numel() * 2;
  EXPECT_EQ(half.parameters, bf16_bytes);
  EXPECT_EQ(half.collectives, 2 * 2 * bf16_bytes);
  // At the end of backward O2's master gradients are not there: the step adds what is beyond them.
  EXPECT_EQ(half.steady - (half.parameters + half.masters + half.buffers + half.gradients - half.buffers +
                           half.optimizer_state + half.activations + half.baseline + half.data),
            half.collectives - half.masters);
}

// A step of two micro-batches holds the second one's gradient of the largest parameter before
// backward adds it into the first's: mlp-wide's fc2 weight, 4096 x 1024 fp32, exactly 16 MiB more.
TEST(MemoryPlan, AccumulationAddsTheLargestParametersIncomingGradient) {
  train::TrainOptions o = synthetic_run("mlp-wide", parallel::StrategyKind::kLocal, 16);
  const auto one_rank = train::MemoryPlanOptions().evaluation(false);
  const train::RankMemory single = train::plan_memory(o, one_rank).ranks.at(0);
  o.trainer().accum_steps(2);
  const train::RankMemory accumulated = train::plan_memory(o, one_rank).ranks.at(0);
  // Each plan makes its own dry run, whose small tensors differ by a few KiB from run to run.
  constexpr double kDryRunSlack = 64 * 1024;
  EXPECT_NEAR(accumulated.activations - single.activations, int64_t{4096} * 1024 * 4, kDryRunSlack);
  EXPECT_NEAR(accumulated.steady - single.steady, int64_t{4096} * 1024 * 4, kDryRunSlack);
}

// See Note [Refusing fast]: without a dry run, each rank's model states and buffers are the full
// plan's to the byte and its peak is no more than the full plan's, so a run refused on them alone
// would be refused by the full plan too.
TEST(MemoryPlan, ModelStatesAloneBoundTheFullPlanFromBelow) {
  using parallel::StrategyKind;
  for (StrategyKind kind : {StrategyKind::kLocal, StrategyKind::kDdp, StrategyKind::kZero1, StrategyKind::kZero2,
                            StrategyKind::kFsdp, StrategyKind::kPipeline}) {
    SCOPED_TRACE(parallel::to_string(kind));
    train::TrainOptions o = synthetic_run("mlp", kind, 8);
    o.optimizer().kind(optim::OptimizerKind::kAdam);
    const int64_t world = kind == StrategyKind::kLocal ? 1 : 2;
    const train::ReferenceData data = train::make_image_data(o);
    train::ProcessMemory process;
    const train::MemoryPlan full = train::plan_with_data(o, train::MemoryPlanOptions().world_size(world), data, process);
    const train::MemoryPlan lower = train::plan_model_states(o, train::MemoryPlanOptions().world_size(world), data, process);
    ASSERT_EQ(lower.ranks.size(), full.ranks.size());
    for (size_t r = 0; r < full.ranks.size(); ++r) {
      EXPECT_EQ(lower.ranks[r].parameters, full.ranks[r].parameters) << "rank " << r;
      EXPECT_EQ(lower.ranks[r].gradients, full.ranks[r].gradients) << "rank " << r;
      EXPECT_EQ(lower.ranks[r].optimizer_state, full.ranks[r].optimizer_state) << "rank " << r;
      EXPECT_EQ(lower.ranks[r].buffers, full.ranks[r].buffers) << "rank " << r;
      EXPECT_EQ(lower.ranks[r].activations, 0) << "rank " << r;
      EXPECT_LE(lower.ranks[r].peak(), full.ranks[r].peak()) << "rank " << r;
    }
  }
}

// A limit below the model states is refused before any dry run, naming the lower bound and the
// strategies that hold fewer states per rank (the pipeline's stage holds part of the model); a
// limit between that bound and the full plan gets the full plan's refusal.
TEST(MemoryPlan, ARunWhoseModelStatesDoNotFitIsRefusedBeforeItsDryRun) {
  const train::TrainOptions o = synthetic_run("convnet", parallel::StrategyKind::kDdp, 32);
  const auto p = train::MemoryPlanOptions().world_size(2);
  const train::ReferenceData data = train::make_image_data(o);
  const auto refusal = [&](int64_t bytes) {
    try {
      train::check_memory_plan(o, p, data, train::ProcessMemory(), train::MemoryLimit{bytes, "a test's limit"});
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string();
  };
  int64_t lower = 0, full = 0;
  {  // the plans' layout model is freed before the check builds its own
    train::ProcessMemory process;
    // A first dry run touches the code and kernels the check's lower bound will then count in
    // this long-lived process, as it does in `lockstep train` (lower bound first, then the plan).
    train::plan_with_data(o, p, data, process);
    lower = train::plan_model_states(o, p, data, process).largest().peak();
    full = train::plan_with_data(o, p, data, process).largest().peak();
  }
  const std::string early = refusal(lower / 2);
  EXPECT_THAT(early, HasSubstr("rank 0 of 2 would need at least"));
  EXPECT_THAT(early, HasSubstr("before any activation"));
  EXPECT_THAT(early, HasSubstr("a test's limit"));
  EXPECT_THAT(early, HasSubstr("pipeline at least"));
  ASSERT_LT(lower + (8 << 20), full);  // room between them
  const std::string late = refusal((lower + full) / 2);
  EXPECT_THAT(late, HasSubstr("rank 0 of 2 would need "));
  EXPECT_THAT(late, Not(HasSubstr("at least")));
  EXPECT_THAT(late, HasSubstr("at its peak"));
}

// A directory tree standing in for /proc and /sys/fs/cgroup.
struct FakeKernel {
  testing::TempDir dir;
  fs::path root = fs::path(dir.path());
  void write(const std::string& relative, const std::string& text) {
    fs::create_directories((root / relative).parent_path());
    std::ofstream(root / relative) << text;
  }
  train::MemoryLimitOptions options(int64_t local_ranks) const {
    return train::MemoryLimitOptions().local_ranks(local_ranks).proc_self_cgroup((root / "cgroup").string())
        .cgroup_root((root / "sys").string()).meminfo((root / "meminfo").string()).resident_bytes(1 << 20);
  }
};

TEST(MemoryLimit, CgroupV2MemoryMaxIsSharedAmongTheLocalRanksAndAParentsSmallerLimitWins) {
  FakeKernel k;
  k.write("cgroup", "0::/job/step\n");
  k.write("sys/job/step/memory.max", "1073741824\n");
  k.write("sys/job/memory.max", "805306368\n");
  k.write("meminfo", "MemTotal: 100 kB\nMemAvailable: 50 kB\n");
  const train::MemoryLimit limit = train::available_memory(k.options(2));
  EXPECT_EQ(limit.bytes, 805306368 / 2);
  EXPECT_THAT(limit.source, HasSubstr("cgroup v2"));
  EXPECT_THAT(limit.source, HasSubstr("job/memory.max"));
}

TEST(MemoryLimit, CgroupV1LimitInBytesIsReadWhereTheMemoryControllerIsMounted) {
  FakeKernel k;
  k.write("cgroup", "9:name=systemd:/\n4:memory:/api/abc\n0::/\n");
  k.write("sys/memory/api/abc/memory.limit_in_bytes", "536870912\n");
  k.write("sys/memory/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "unlimited"
  const train::MemoryLimit limit = train::available_memory(k.options(1));
  EXPECT_EQ(limit.bytes, 536870912);
  EXPECT_THAT(limit.source, HasSubstr("cgroup v1"));
}

TEST(MemoryLimit, WithoutALimitMemAvailableIsSharedAndThisProcessKeepsWhatItHolds) {
  FakeKernel k;
  k.write("cgroup", "0::/user.slice\n");
  k.write("sys/user.slice/memory.max", "max\n");
  k.write("meminfo", "MemTotal: 2048 kB\nMemFree: 10 kB\nMemAvailable: 4096 kB\n");
  const train::MemoryLimit limit = train::available_memory(k.options(4));
  EXPECT_EQ(limit.bytes, 4096 * 1024 / 4 + (1 << 20));
  EXPECT_THAT(limit.source, HasSubstr("MemAvailable"));
}

TEST(MemoryLimit, AnUnreadableLimitNamesTheFileAndItsText) {
  FakeKernel k;
  k.write("cgroup", "0::/job\n");
  k.write("sys/job/memory.max", "lots\n");
  try {
    train::available_memory(k.options(1));
    FAIL() << "no error for 'lots'";
  } catch (const c10::ValueError& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("job/memory.max' holds 'lots'"));
  }
  EXPECT_THROW(train::available_memory(k.options(0)), c10::ValueError);
}

}  // namespace
}  // namespace lockstep
