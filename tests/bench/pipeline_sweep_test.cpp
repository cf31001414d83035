#include "lockstep/bench/pipeline_sweep.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <regex>

#include "../test_util.h"

namespace lockstep::bench {
namespace {

using ::testing::HasSubstr;

// Every (data-series, data-x) -> data-y point of a line chart (Note [Charts that carry their values]).
std::map<std::pair<std::string, double>, double> points(const std::string& svg) {
  const std::regex point("data-series=\"([^\"]*)\" data-x=\"([^\"]*)\" data-y=\"([^\"]*)\"");
  std::map<std::pair<std::string, double>, double> out;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), point); it != std::sregex_iterator(); ++it)
    out[{(*it)[1], std::stod((*it)[2])}] = std::stod((*it)[3]);
  return out;
}

TEST(PipelineSweep, RejectsCountsThatAreNotAPipelineOfThisBatch) {
  EXPECT_THAT(testing::error_message([] { PipelineSweepOptions().micro_batches({1, 4}).validate(16); }),
              HasSubstr("M=1 must be at least 2 (M=1 is the model-parallel row)"));
  EXPECT_THAT(testing::error_message([] { PipelineSweepOptions().micro_batches({4, 32}).validate(16); }),
              HasSubstr("M=32 must be at least 2 (M=1 is the model-parallel row) and at most the batch (--batch-size 16)"));
  EXPECT_THAT(testing::error_message([] { PipelineSweepOptions().stages(1).validate(16); }),
              HasSubstr("--stages 1: the pipeline sweep needs at least 2 stages"));
}

// `lockstep bench --pipeline-sweep` on a tiny MLP: one process, model parallel and gpipe/1f1b at
// M = 2 and 4, each a child run; every row succeeds, the pipelined rows report both stages, the
// table puts the bubble formula beside the measured idle time, 1F1B's first stage holds fewer
// activation bytes than GPipe's at M = 4, and the charts carry the table's figures.
TEST(PipelineSweep, RunsEveryRowAndWritesTableAndCharts) {
  testing::TempDir dir;
  const auto r = testing::run_command(std::string(LOCKSTEP_CLI) + " bench --pipeline-sweep --model mlp --data synthetic "
                                      "--limit 64 --batch-size 16 --stages 2 --micro-batch-counts 2,4 --timeout 300 --out " +
                                      dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("[6/6] 1f1b M=4: "));
  const auto j = nlohmann::json::parse(testing::read_text(dir / "pipeline_sweep.json"));
  ASSERT_EQ(j["rows"].size(), 6u);
  std::map<std::string, nlohmann::json> rows;
  for (const auto& row : j["rows"]) {
    EXPECT_TRUE(row["ok"].get<bool>()) << row["name"] << ": " << row["error"];
    EXPECT_GT(row["step_s"].get<double>(), 0) << row["name"];
    rows[row["name"].get<std::string>()] = row;
  }
  EXPECT_EQ(rows["one process"]["stages"].size(), 0u);
  ASSERT_EQ(rows["gpipe M=4"]["stages"].size(), 2u);
  EXPECT_DOUBLE_EQ(rows["gpipe M=4"]["bubble"].get<double>(), 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(rows["model parallel"]["bubble"].get<double>(), 1.0 / 2.0);
  for (const auto& stage : rows["gpipe M=4"]["stages"]) {
    EXPECT_GT(stage["peak_rss_mib"].get<double>(), 0);
    EXPECT_GE(stage["idle_fraction"].get<double>(), 0);
    EXPECT_LT(stage["idle_fraction"].get<double>(), 1);
  }
  EXPECT_LT(rows["1f1b M=4"]["stages"][0]["activation_bytes"].get<int64_t>(),
            rows["gpipe M=4"]["stages"][0]["activation_bytes"].get<int64_t>());

  const std::string md = testing::read_text(dir / "pipeline_sweep.md");
  EXPECT_THAT(md, HasSubstr("| bubble (K-1)/(M+K-1) | measured idle per stage |"));
  EXPECT_THAT(md, HasSubstr("| gpipe M=4 | 4 | "));
  EXPECT_THAT(md, HasSubstr("Fastest pipelined run: **"));
  const auto time = points(testing::read_text(dir / "time_per_step.svg"));
  EXPECT_NEAR(time.at({"gpipe pipeline (K=2)", 4.0}), 1000.0 * rows["gpipe M=4"]["step_s"].get<double>(), 1e-6);
  EXPECT_NEAR(time.at({"1f1b pipeline (K=2)", 1.0}), 1000.0 * rows["model parallel"]["step_s"].get<double>(), 1e-6);
  const auto idle = points(testing::read_text(dir / "idle.svg"));
  EXPECT_NEAR(idle.at({"bubble formula", 2.0}), 100.0 / 3.0, 1e-6);
  EXPECT_NEAR(idle.at({"1f1b stage 1", 4.0}),
              100.0 * rows["1f1b M=4"]["stages"][1]["idle_fraction"].get<double>(), 1e-6);
  EXPECT_THAT(testing::read_text(dir / "pipeline_sweep.csv"), HasSubstr("\"gpipe M=2\",gpipe,2,2,true,"));
}

}  // namespace
}  // namespace lockstep::bench
