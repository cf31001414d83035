// bench/scaling.h: the model fitted back from results it generated, results files read back, a
// profiled run's step, and `lockstep plan`'s time tables.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../test_util.h"
#include "lockstep/bench/scaling.h"
#include "lockstep/core/atomic_file.h"

namespace lockstep::bench {
namespace {

using ::testing::HasSubstr;

// What `lockstep bench --collectives` would measure on hosts that follow `costs` exactly.
std::vector<CollectiveTiming> modelled_rows(const dist::CollectiveCosts& costs) {
  std::vector<CollectiveTiming> rows;
  for (const auto& [hosts, ranks] : std::vector<std::pair<int64_t, int64_t>>{{2, 1}, {1, 2}, {2, 2}, {3, 2}}) {
    for (const std::string algorithm : {"flat", "hierarchical"}) {
      if (algorithm == "hierarchical" && (hosts < 2 || ranks < 2)) continue;
      for (int64_t bytes = 1 << 20; bytes <= (64 << 20); bytes *= 4) {
        CollectiveTiming r;
        r.collective = "all_reduce";
        r.algorithm = algorithm;
        r.bytes = bytes;
        r.hosts = hosts;
        r.ranks = hosts * ranks;
        r.seconds = costs.all_reduce_seconds(bytes, {hosts, ranks}, algorithm == "flat"
                                                                       ? dist::AllReduceAlgorithm::kFlat
                                                                       : dist::AllReduceAlgorithm::kHierarchical);
        r.algbw_gbps = static_cast<double>(bytes) / r.seconds / 1e9;
        r.busbw_gbps = r.algbw_gbps;
        rows.push_back(r);
      }
    }
  }
  return rows;
}

TEST(Scaling, TheFitRecoversTheLinkAndHostAndPredictsEveryOtherConfiguration) {
  dist::CollectiveCosts truth;
  truth.link = dist::LinkCost{1.2e-4, 8.4e-9};
  truth.host = dist::LinkCost{3e-5, 4e-10};
  testing::TempDir dir;
  const std::string text = collectives_csv(modelled_rows(truth));
  write_file_atomic(dir / "collectives.csv", std::vector<char>(text.begin(), text.end()));
  const auto rows = read_collectives_csv(dir / "collectives.csv");  // times rounded to 0.1 us
  ASSERT_EQ(rows.size(), 4u * 6u);
  const dist::CollectiveCosts fit = fit_collective_costs(rows, 1 << 20);
  EXPECT_NEAR(fit.link.alpha, truth.link.alpha, 1e-6);
  EXPECT_NEAR(fit.link.beta / truth.link.beta, 1.0, 1e-5);
  EXPECT_NEAR(fit.host.beta / truth.host.beta, 1.0, 1e-3);
  const auto checks = check_collective_costs(fit, rows, 1 << 20);
  ASSERT_EQ(checks.size(), rows.size());
  for (const auto& c : checks) EXPECT_LT(std::abs(c.error()), 1e-3) << c.measured.hosts << " x " << c.measured.ranks;
  EXPECT_THAT([&] { fit_collective_costs(rows, int64_t{1} << 40); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("2 hosts x 1 rank at two sizes")));
}

// Three runs of one configuration (times x1, x1.02, x0.99), the second twice as slow at 16 MiB: every
// row is the first run's, the middle one; an even count takes the mean of the middle two.
TEST(Scaling, RunsOfOneConfigurationAreCheckedAtTheirMedian) {
  dist::CollectiveCosts truth;
  truth.link = dist::LinkCost{1.2e-4, 8.4e-9};
  truth.host = dist::LinkCost{3e-5, 4e-10};
  const std::vector<CollectiveTiming> run = modelled_rows(truth);
  std::vector<CollectiveTiming> runs;
  for (const double scale : {1.0, 1.02, 0.99}) {
    for (CollectiveTiming r : run) {
      r.seconds *= scale == 1.02 && r.bytes == (16 << 20) ? 2.0 : scale;
      runs.push_back(r);
    }
  }
  const auto medians = median_of_runs(runs);
  ASSERT_EQ(medians.size(), run.size());
  for (size_t i = 0; i < run.size(); ++i) {
    EXPECT_EQ(medians[i].bytes, run[i].bytes);
    EXPECT_EQ(medians[i].algorithm, run[i].algorithm);
    EXPECT_EQ(medians[i].runs, 3);
    EXPECT_NEAR(medians[i].seconds / run[i].seconds, 1.0, 1e-12)
        << run[i].hosts << " x " << run[i].ranks << " at " << run[i].bytes;
    EXPECT_NEAR(medians[i].algbw_gbps, static_cast<double>(run[i].bytes) / medians[i].seconds / 1e9, 1e-9);
  }
  std::vector<CollectiveTiming> two = {run[0], run[0]};
  two[1].seconds = 3.0 * run[0].seconds;
  EXPECT_NEAR(median_of_runs(two).at(0).seconds, 2.0 * run[0].seconds, 1e-12);
}

TEST(Scaling, AMalformedResultsFileIsNamedWithItsLine) {
  testing::TempDir dir;
  const std::string text = "collective,algorithm,bytes,ranks,hosts,time_us,algbw_gbps,busbw_gbps\nall_reduce,flat,x,2,1,1,1,1\n";
  write_file_atomic(dir / "bad.csv", std::vector<char>(text.begin(), text.end()));
  EXPECT_THAT([&] { read_collectives_csv(dir / "bad.csv"); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("bad.csv:2: a field is not a number")));
  // A row of 0 hosts made `plan --collectives` divide by zero (SIGFPE); ranks not a multiple of hosts.
  for (const std::string row : {"all_reduce,flat,1024,2,0,1,1,1", "all_reduce,flat,1024,3,2,1,1,1"}) {
    const std::string bad = "collective,algorithm,bytes,ranks,hosts,time_us,algbw_gbps,busbw_gbps\n" + row + "\n";
    write_file_atomic(dir / "bad.csv", std::vector<char>(bad.begin(), bad.end()));
    EXPECT_THAT([&] { read_collectives_csv(dir / "bad.csv"); },
                ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("bad.csv:2: hosts "))) << row;
  }
}

// A real profiled run gives the step's phases; the plan extrapolates them, and on one host with
// one rank a step is just its compute.
TEST(Scaling, PlanPredictsTheStepOfAProfiledRunAtManyHosts) {
  testing::TempDir dir;
  const std::string cli = LOCKSTEP_CLI;
  const auto run = testing::run_command("timeout 120 " + cli + " train --model mlp --data synthetic --limit 256 "
                                        "--batch-size 32 --epochs 1 --quiet --threads 1 --ignore-memory-plan "
                                        "--profile --log-jsonl " + dir / "run.jsonl");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const dist::StepShape step = step_shape_from_log(dir / "run.jsonl");
  EXPECT_EQ(step.gradient_bytes, 814120);  // mlp's parameters in fp32
  EXPECT_GT(step.forward_s, 0.0);
  EXPECT_GT(step.backward_s, 0.0);
  dist::CollectiveCosts costs;
  costs.link = dist::LinkCost::parse("10Gbit/50us");
  costs.host = dist::LinkCost::parse("16Gbit/100us");
  const auto rows = predict_scaling(step, costs, 8, 128);
  ASSERT_EQ(rows.size(), 8u);  // 1, 2, ..., 128 hosts
  EXPECT_EQ(rows.back().shape.ranks(), 1024);
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_GE(rows[i].flat.step_s, rows[i - 1].flat.step_s);
  EXPECT_TRUE(rows.back().hierarchical_wins());  // 2 x 1023 link latencies against 2 x 127
  const auto plan = testing::run_command(cli + " plan --nodes 128 --ranks-per-node 8 --link 10Gbit/50us --profile-log " +
                                         dir / "run.jsonl");
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_THAT(plan.output, HasSubstr("| 128 | 1024 | "));
  EXPECT_THAT(plan.output, HasSubstr("| hierarchical |"));
  const auto missing = testing::run_command(cli + " plan --nodes 4 2>&1");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.output, HasSubstr("give --profile-log"));
}

}  // namespace
}  // namespace lockstep::bench
