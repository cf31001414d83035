#include "lockstep/core/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <utility>
#include <vector>

#include "../test_util.h"
#include "lockstep/launch/launcher.h"
#include "lockstep/log/run_log.h"
#include "lockstep/train/train.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using Lines = std::vector<std::pair<ReportKind, std::string>>;

Reporter collect_into(Lines& lines) {
  return [&lines](ReportKind kind, const std::string& line) { lines.emplace_back(kind, line); };
}

TEST(Report, StdioReporterPrintsEachKindAsTheCommandAlwaysHas) {
  const Reporter r = stdio_reporter();
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  r(ReportKind::kInfo, "epoch 1/1 done");
  r(ReportKind::kNotice, "step 3 skipped");
  r(ReportKind::kWarning, "cut-off line");
  r(ReportKind::kError, "logging stopped");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "epoch 1/1 done\n");
  EXPECT_EQ(err, "lockstep: step 3 skipped\nlockstep: warning: cut-off line\nlockstep: error: logging stopped\n");
}

TEST(Report, StdioReporterNamesTheProgramItReportsFor) {
  ::testing::internal::CaptureStderr();
  stdio_reporter("lockstep run")(ReportKind::kNotice, "restarting the worker group");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "lockstep run: restarting the worker group\n");
}

// The launcher's own lines (a worker failed, its stderr's tail) reach the caller's reporter; the
// workers' output is still forwarded, each line under its rank.
TEST(Report, LauncherReportsAFailedWorkerToTheCallersReporter) {
  Lines lines;
  launch::Launcher launcher(launch::LaunchOptions({"sh", "-c", "echo 'out of cheese' >&2; exit 3"})
                                .grace_period(1.0)
                                .reporter(collect_into(lines)));
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(launcher.run(), 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("[rank 0] out of cheese"));
  EXPECT_THAT(err, ::testing::Not(HasSubstr("lockstep run:")));
  std::string said;
  for (const auto& [kind, line] : lines) said += line + "\n";
  EXPECT_THAT(said, HasSubstr("exited with code 3"));
  EXPECT_THAT(said, HasSubstr("last 1 line of rank 0's stderr:\n  out of cheese"));
}

// A warning the run log recovers from reaches the caller's reporter and nothing reaches stderr.
TEST(Report, RunLogWarnsThroughTheCallersReporter) {
  testing::TempDir dir;
  std::ofstream(dir / "run.jsonl") << "{\"a\":1}\n{\"b\"";
  Lines lines;
  ::testing::internal::CaptureStderr();
  log::RunLog(log::RunLogOptions().jsonl(dir / "run.jsonl").append(true).reporter(collect_into(lines)));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].first, ReportKind::kWarning);
  EXPECT_THAT(lines[0].second, HasSubstr("ended in a cut-off line (4 bytes)"));
}

// A run's memory line and its checkpoint notes go to the run's reporter: a program that trains
// prints nothing it did not ask for (the progress display and the epoch lines that come with it
// are off here).
TEST(Report, TrainingReportsThroughTheCallersReporterOnly) {
  testing::TempDir dir;
  Lines lines;
  auto run = train::TrainOptions().model("mlp").data(train::DataSource::kSynthetic).limit(40);
  run.trainer().batch_size(20).epochs(2).progress(nullptr).report_memory(true).reporter(collect_into(lines))
      .checkpoint().dir(dir / "ckpt");
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  train::train(run);
  run.trainer().epochs(3).checkpoint().resume("latest");
  train::train(run);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "");
  std::vector<std::string> info;
  for (const auto& [kind, line] : lines)
    if (kind == ReportKind::kInfo) info.push_back(line.substr(0, line.find(':')));
  EXPECT_THAT(info, ::testing::ElementsAre("rank 0 memory", "resumed from '" + (dir / "ckpt/step-00000004.pt'"),
                                           "rank 0 memory"));
}

}  // namespace
}  // namespace lockstep
