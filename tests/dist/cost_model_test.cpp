// Note [The alpha-beta model] and Note [A step's exposed communication], by hand-worked numbers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

#include "lockstep/dist/cost_model.h"

namespace lockstep::dist {
namespace {

using ::testing::HasSubstr;

TEST(CostModel, LinksParseFromRateAndLatency) {
  const LinkCost fast = LinkCost::parse("100Gbit/5us");
  EXPECT_DOUBLE_EQ(fast.alpha, 5e-6);
  EXPECT_DOUBLE_EQ(fast.beta, 8.0 / 100e9);
  const LinkCost slow = LinkCost::parse("1gbit/0.25ms");
  EXPECT_DOUBLE_EQ(slow.alpha, 2.5e-4);
  EXPECT_DOUBLE_EQ(slow.beta, 8e-9);
  EXPECT_THAT(fast.describe(), HasSubstr("alpha 5.0 us, beta 0.0800 ns/B (12.500 GB/s)"));
  EXPECT_THAT([] { LinkCost::parse("100Gbit"); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("link '100Gbit' has no '/': give RATE/LATENCY")));
  EXPECT_THAT([] { LinkCost::parse("fast/5us"); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("rate 'fast' is not a positive number of bit/s")));
  EXPECT_THAT([] { LinkCost::parse("1Gbit/5 parsecs"); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("latency '5 parsecs' is not a positive time")));
}

TEST(CostModel, AllReduceTimesFollowTheRingAndHierarchicalFormulas) {
  CollectiveCosts c;
  c.link = LinkCost{1e-4, 8e-9};  // 1 Gbit/s, 100 us
  c.host = LinkCost{2e-5, 5e-10};
  const int64_t s = int64_t{64} << 20;
  const double sd = static_cast<double>(s);
  EXPECT_EQ(c.all_reduce_seconds(s, {1, 1}, AllReduceAlgorithm::kFlat), 0.0);
  EXPECT_DOUBLE_EQ(c.all_reduce_seconds(s, {1, 2}, AllReduceAlgorithm::kHierarchical), 2e-5 + sd * 5e-10);
  // 2 hosts x 2 ranks, flat: a ring of 4, 6 steps, 1.5 S over each link.
  EXPECT_DOUBLE_EQ(c.all_reduce_seconds(s, {2, 2}, AllReduceAlgorithm::kFlat), 6e-4 + 1.5 * sd * 8e-9);
  // hierarchical: 2 steps, S over each link, and the first piece's sum and the last one's gather.
  const double piece = 2e-5 + 2.0 * (1 << 20) * 5e-10;
  EXPECT_DOUBLE_EQ(c.all_reduce_seconds(s, {2, 2}, AllReduceAlgorithm::kHierarchical),
                   2e-4 + sd * 8e-9 + 2.0 * piece);
  // One rank per host: hierarchical is the flat ring.
  EXPECT_EQ(c.all_reduce_seconds(s, {3, 1}, AllReduceAlgorithm::kHierarchical),
            c.all_reduce_seconds(s, {3, 1}, AllReduceAlgorithm::kFlat));
}

TEST(CostModel, TheFitRecoversALineAndRefusesOneSize) {
  const std::vector<double> bytes{1e3, 1e5, 1e7, 1e8};
  std::vector<double> seconds;
  for (double b : bytes) seconds.push_back(3e-4 + b * 7e-9);
  const LinkCost fit = fit_line(bytes, seconds);
  EXPECT_NEAR(fit.alpha, 3e-4, 1e-12);
  EXPECT_NEAR(fit.beta, 7e-9, 1e-18);
  EXPECT_THAT([] { fit_line({1e3, 1e3}, {1.0, 2.0}); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("needs at least two distinct sizes")));
}

// Times whose free fit has a negative intercept (-56 us here, from 0.5% of noise on 1-64 MiB at 8 ns/B):
// the fit keeps alpha at 0 and gives the weighted best slope through the origin, whose relative
// errors stay within the noise.
TEST(CostModel, TheFitNeverGivesANegativeLatency) {
  const std::vector<double> bytes{1 << 20, 4 << 20, 16 << 20, 64 << 20};
  const std::vector<double> noise{0.995, 1.0, 1.002, 1.001};
  std::vector<double> seconds;
  for (size_t i = 0; i < bytes.size(); ++i) seconds.push_back(bytes[i] * 8e-9 * noise[i]);
  const LinkCost fit = fit_line(bytes, seconds);
  EXPECT_EQ(fit.alpha, 0.0);
  EXPECT_NEAR(fit.beta / 8e-9, 1.0, 5e-3);
  for (size_t i = 0; i < bytes.size(); ++i) EXPECT_NEAR(fit.beta * bytes[i] / seconds[i], 1.0, 6e-3) << bytes[i];
}

TEST(CostModel, BucketsOverlapBackwardAndOnlyTheRestIsExposed) {
  CollectiveCosts c;
  c.link = LinkCost{0.0, 1e-9};  // 1 ns per byte: a 2-host x 1-rank ring takes S ns
  StepShape step;
  step.forward_s = 0.010;
  step.backward_s = 0.020;
  step.optimizer_s = 0.005;
  step.gradient_bytes = 4'000'000;
  step.first_bucket_bytes = 1'000'000;
  step.bucket_bytes = 3'000'000;
  // Bucket 1 (1 MB) is ready at 5 ms and takes 1 ms; bucket 2 (3 MB) is ready at 20 ms and takes 3 ms.
  const StepPrediction p = predict_step(step, c, {2, 1}, AllReduceAlgorithm::kFlat);
  EXPECT_NEAR(p.communication_s, 0.004, 1e-12);
  EXPECT_NEAR(p.exposed_s, 0.003, 1e-12);
  EXPECT_NEAR(p.step_s, 0.038, 1e-12);
  step.backward_s = 0.001;  // communication longer than backward: it all queues up behind it
  EXPECT_NEAR(predict_step(step, c, {2, 1}, AllReduceAlgorithm::kFlat).exposed_s, 0.004 - 0.001 + 0.00025, 1e-12);
}

// Issue 54 item 10: shapes are bounded as jobs are (2^20 ranks), checked before multiplying.
// Before: 2^62 hosts passed, and doubling them wrapped to a negative count (lockstep plan --nodes
// looped on in 16.9 GB); ranks per host near 2^63 multiplied into -2, -4 and 0 ranks.
TEST(CostModel, ShapesPastTheLargestJobAreRefusedBeforeMultiplying) {
  CollectiveCosts c;
  c.link = LinkCost{1e-4, 8e-9};
  c.host = LinkCost{2e-5, 5e-10};
  const int64_t s = int64_t{64} << 20;
  EXPECT_THAT([&] { c.all_reduce_seconds(s, {int64_t{1} << 62, 1}, AllReduceAlgorithm::kFlat); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr(
                  "a cluster of 4611686018427387904 hosts (ClusterShape::hosts) x 1 ranks per host "
                  "(ClusterShape::ranks_per_host) is not a job lockstep runs: each must be at least 1 and their "
                  "product at most 1048576 ranks")));
  const int64_t most = std::numeric_limits<int64_t>::max();
  EXPECT_THAT([&] { c.all_reduce_seconds(s, {2, most}, AllReduceAlgorithm::kHierarchical); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("2 hosts (ClusterShape::hosts) x 9223372036854775807")));
  EXPECT_THROW((ClusterShape{0, 8}.ranks()), c10::ValueError);
  EXPECT_THROW((ClusterShape{1024, 1025}.ranks()), c10::ValueError);
  EXPECT_EQ((ClusterShape{1024, 1024}.ranks()), int64_t{1} << 20);
  StepShape step;
  step.gradient_bytes = int64_t{100} << 20;
  EXPECT_THAT([&] { predict_step(step, c, {most / 2, 3}, AllReduceAlgorithm::kFlat); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("is not a job lockstep runs")));
}

// predict_step walks the buckets one by one: their count is bounded before the walk (before: a
// bucket of 0 bytes looped for ever, 2^63 gradient bytes walked 3.5 x 10^11 buckets).
TEST(CostModel, ABucketWalkIsCountedBeforeItStarts) {
  StepShape step;
  step.gradient_bytes = (int64_t{1} << 20) + (int64_t{50} << 20) + 1;  // the first bucket, two full, one byte
  EXPECT_EQ(step.buckets(), 4);
  step.gradient_bytes = std::numeric_limits<int64_t>::max();
  EXPECT_THAT([&] { step.buckets(); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr(
                  "gradient_bytes 9223372036854775807 in buckets of bucket_bytes 26214400 make 351843720890 buckets, "
                  "more than the 1048576")));
  step.gradient_bytes = 1000;
  step.bucket_bytes = 0;
  EXPECT_THAT([&] { predict_step(step, CollectiveCosts{}, {2, 1}, AllReduceAlgorithm::kFlat); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("bucket_bytes 0 must hold at least 1 byte each")));
}

}  // namespace
}  // namespace lockstep::dist
