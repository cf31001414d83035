#include "lockstep/log/bench_results.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace lockstep::log {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::Each;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kMiBytes = 1 << 20;

// A finished row that trained as its arguments say, at `speed` samples/s.
BenchRow row(std::string name, std::string strategy, std::string precision, std::string opt_level, double speed,
             int64_t world_size = 2, int64_t threads = 1) {
  BenchRow r;
  r.name = std::move(name), r.strategy = std::move(strategy), r.precision = std::move(precision);
  r.opt_level = std::move(opt_level), r.samples_per_s = speed, r.world_size = world_size, r.threads = threads;
  r.ok = true, r.data = "fashion-mnist", r.peak_rss_mib = 300, r.test_acc = 0.85;
  r.param_bytes = r.grad_bytes = kMiBytes, r.optim_bytes = 2 * kMiBytes;
  return r;
}

std::string joined(const std::vector<std::string>& sentences) {
  std::string all;
  for (const std::string& s : sentences) all += s + "\n";
  return all;
}

// The Intel Xeon of issue 35: bf16 slower than fp32 in every configuration.
TEST(BenchAdvice, WhereBf16RanSlowerItAdvisesFp32AndNeverBf16ForSpeed) {
  BenchResults b;
  b.rows = {row("local fp32", "local", "fp32", "O0", 3000, 1, 2), row("local bf16 O1", "local", "bf16", "O1", 2610, 1, 2),
            row("ddp", "ddp", "fp32", "O0", 7515), row("ddp + bf16 O1", "ddp", "bf16", "O1", 6533)};
  b.rows[1].peak_rss_mib = 240;  // bf16 smaller
  const std::string advice = joined(bench_advice(b));
  EXPECT_THAT(advice, HasSubstr("local bf16 O1 ran at 0.87x local fp32's speed"));
  EXPECT_THAT(advice, HasSubstr("ddp + bf16 O1 ran at 0.87x ddp's speed"));
  EXPECT_THAT(advice, HasSubstr("bf16 did not pay for speed on this CPU: train in fp32 here, or in bf16 for memory "
                                "alone (local bf16 O1 peaked at 240 MiB against 300)"));
  EXPECT_THAT(advice, Not(HasSubstr("pays for speed")));
  EXPECT_THAT(advice, HasSubstr("Fastest here: **ddp** (7515 samples/s); smallest rank 0: **local bf16 O1** (240 MiB"));
}

// The AMD EPYC of earlier rounds: bf16 2.4x fp32; pure bf16 lost accuracy.
TEST(BenchAdvice, WhereBf16RanFasterItSaysSoAndNamesAnAccuracyLoss) {
  BenchResults b;
  b.rows = {row("local fp32", "local", "fp32", "O0", 3000, 1, 2), row("local bf16 O1", "local", "bf16", "O1", 7200, 1, 2),
            row("local pure bf16 O3", "local", "bf16", "O3", 7500, 1, 2)};
  b.rows[2].test_acc = 0.80;
  const std::string advice = joined(bench_advice(b));
  EXPECT_THAT(advice, HasSubstr("local bf16 O1 ran at 2.40x local fp32's speed; local pure bf16 O3 ran at 2.50x"));
  EXPECT_THAT(advice, HasSubstr("bf16 pays for speed on this CPU."));
  EXPECT_THAT(advice, HasSubstr("local pure bf16 O3's test accuracy trailed local fp32's by 5.0 points (0.8000 against "
                                "0.8500)"));
  EXPECT_THAT(advice, Not(HasSubstr("local bf16 O1's test accuracy")));
}

TEST(BenchAdvice, ShardedStrategiesAndOptionsAreMeasuredAgainstTheirDdpRow) {
  BenchResults b;
  b.rows = {row("ddp", "ddp", "fp32", "O0", 7000), row("zero2", "zero2", "fp32", "O0", 6930),
            row("fsdp", "fsdp", "fp32", "O0", 5040), row("ddp + SyncBN", "ddp", "fp32", "O0", 5320),
            row("ddp from PNG files", "ddp", "fp32", "O0", 6300), row("dp (DataParallel)", "dp", "fp32", "O0", 3500, 1, 2)};
  b.rows[1].grad_bytes = kMiBytes / 2, b.rows[1].optim_bytes = 3 * kMiBytes / 2;  // 3 of ddp's 4 MiB
  b.rows[2].param_bytes = kMiBytes / 2, b.rows[2].grad_bytes = kMiBytes / 2, b.rows[2].optim_bytes = kMiBytes;  // 2
  b.rows[3].sync_bn = true;
  b.rows[4].data = "imagefolder";
  const std::string advice = joined(bench_advice(b));
  EXPECT_THAT(advice, HasSubstr("**zero2** ran at 0.99x **ddp**'s speed holding 0.75x its parameters, gradients and "
                                "optimizer state on rank 0 (3.00 against 4.00 MiB): the memory is saved at no cost"));
  EXPECT_THAT(advice, HasSubstr("**fsdp** ran at 0.72x **ddp**'s speed holding 0.50x its parameters, gradients and "
                                "optimizer state on rank 0 (2.00 against 4.00 MiB): worth it when a replica's state "
                                "does not fit"));
  EXPECT_THAT(advice, HasSubstr("**ddp + SyncBN** ran at 0.76x **ddp**'s speed: its cost here"));
  EXPECT_THAT(advice, HasSubstr("**ddp from PNG files** ran at 0.90x **ddp**'s speed reading imagefolder"));
  EXPECT_THAT(advice, HasSubstr("**ddp** ran at 2.00x **dp (DataParallel)**'s speed (7000 against 3500 samples/s): "
                                "start one process per device"));
  EXPECT_THAT(advice, Not(HasSubstr("bf16")));  // no bf16 row ran: nothing is said of it
}

TEST(BenchAdvice, ComparesLockstepWithThePeerOfTheSameConfiguration) {
  BenchResults b;
  BenchRow peer = row("ddp", "ddp", "fp32", "O0", 5000);
  peer.implementation = "pytorch", peer.peak_rss_mib = 400;
  BenchRow peer_bf16 = row("ddp + bf16 O1", "ddp", "bf16", "O1", 4000);
  peer_bf16.implementation = "pytorch";
  b.rows = {row("ddp", "ddp", "fp32", "O0", 7000), peer, peer_bf16};
  const std::string advice = joined(bench_advice(b));
  EXPECT_THAT(advice, HasSubstr("lockstep against the peer: ddp at 1.40x pytorch's speed (7000 against 5000 "
                                "samples/s) and 0.75x its peak RSS."));
  EXPECT_THAT(advice, Not(HasSubstr("ddp + bf16 O1 at")));  // its lockstep row did not run
  EXPECT_THAT(advice, Not(HasSubstr("bf16 did not pay")));  // the peer's rows say nothing of lockstep's precision
}

TEST(BenchAdvice, FailedRowsAndRowsOfUnknownConfigurationAreLeftOut) {
  BenchResults b;
  b.rows = {row("ddp", "ddp", "fp32", "O0", 7000), row("ddp + bf16 O1", "ddp", "bf16", "O1", 9000),
            row("zero1", "zero1", "fp32", "O0", 1)};
  b.rows[1].ok = false;                // failed
  b.rows[2].strategy.clear();          // from a results.json written before the fields existed
  const std::vector<std::string> advice = bench_advice(b);
  ASSERT_EQ(advice.size(), 1u);
  EXPECT_THAT(advice[0], HasSubstr("Fastest here: **ddp**"));
  EXPECT_THAT(bench_advice(BenchResults{}), ::testing::IsEmpty());
  EXPECT_THAT(to_markdown(b), AllOf(HasSubstr("## What to pick\n\n- Fastest here: **ddp**"), Not(HasSubstr("zero1**"))));
}

}  // namespace
}  // namespace lockstep::log
