// The statistics extension's counters and the Prometheus text: per-request and per-batch counts,
// and a cumulative batch-size histogram.
#include "lockstep/serve/statistics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace lockstep {
namespace {

using ::testing::HasSubstr;

TEST(ServeStatistics, CountsSamplesRequestsAndBatchesAsTritonDoes) {
  serve::ModelStatistics stats;
  stats.record_batch(/*samples=*/5, /*requests=*/3, /*queue_ns=*/300, 10, 1000, 20);
  stats.record_batch(1, 1, 50, 1, 200, 2);
  stats.record_batch(5, 2, 100, 10, 900, 20);
  stats.record_success(5000);
  stats.record_failure(700);
  const auto j = stats.to_json("convnet", "1");
  EXPECT_EQ(j["inference_count"], 11);  // samples
  EXPECT_EQ(j["execution_count"], 3);   // forwards
  EXPECT_EQ(j["inference_stats"]["queue"], nlohmann::json({{"count", 6}, {"ns", 450}}));
  // Per request: each request of a batch counts that batch's compute time.
  EXPECT_EQ(j["inference_stats"]["compute_infer"], nlohmann::json({{"count", 6}, {"ns", 3 * 1000 + 200 + 2 * 900}}));
  EXPECT_EQ(j["inference_stats"]["success"], nlohmann::json({{"count", 1}, {"ns", 5000}}));
  EXPECT_EQ(j["inference_stats"]["fail"], nlohmann::json({{"count", 1}, {"ns", 700}}));
  ASSERT_EQ(j["batch_stats"].size(), 2u);
  EXPECT_EQ(j["batch_stats"][0]["batch_size"], 1);
  EXPECT_EQ(j["batch_stats"][1]["batch_size"], 5);
  EXPECT_EQ(j["batch_stats"][1]["compute_infer"], nlohmann::json({{"count", 2}, {"ns", 1900}}));
  EXPECT_GT(j["last_inference"].get<int64_t>(), 0);
}

TEST(ServeStatistics, PrometheusTextGroupsEachFamilyAndHasACumulativeBatchSizeHistogram) {
  serve::ModelStatistics a, b;
  a.record_batch(5, 3, 0, 0, 0, 0);
  a.record_batch(1, 1, 0, 0, 0, 0);
  a.record_batch(64, 64, 0, 0, 0, 0);
  b.record_success(2500000);
  const std::string text = serve::prometheus_text({{"convnet", "1", a.snapshot()}, {"mlp", "2", b.snapshot()}});
  EXPECT_THAT(text, HasSubstr("# TYPE nv_inference_count counter\n"
                              "nv_inference_count{model=\"convnet\",version=\"1\"} 70\n"
                              "nv_inference_count{model=\"mlp\",version=\"2\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("nv_inference_request_duration_us{model=\"mlp\",version=\"2\"} 2500\n"));
  EXPECT_THAT(text, HasSubstr("lockstep_batch_size_bucket{model=\"convnet\",version=\"1\",le=\"1\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lockstep_batch_size_bucket{model=\"convnet\",version=\"1\",le=\"4\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lockstep_batch_size_bucket{model=\"convnet\",version=\"1\",le=\"8\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("lockstep_batch_size_bucket{model=\"convnet\",version=\"1\",le=\"64\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("lockstep_batch_size_sum{model=\"convnet\",version=\"1\"} 70\n"));
  EXPECT_THAT(text, HasSubstr("lockstep_batch_size_count{model=\"convnet\",version=\"1\"} 3\n"));
}

}  // namespace
}  // namespace lockstep
