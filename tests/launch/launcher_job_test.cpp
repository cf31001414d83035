// `lockstep run` and the job it starts: the job's id the workers see, and what a failure report
// says about a rank that had ended before it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <regex>

#include "../test_util.h"

namespace lockstep {
namespace {

using std::chrono::seconds;
using testing::ChildProcess;
using testing::TempDir;
using ::testing::HasSubstr;

struct LaunchResult {
  int exit_code = -1;
  std::string output;
};

LaunchResult launch_run(const TempDir& dir, std::vector<std::string> args) {
  args.insert(args.begin(), {LOCKSTEP_CLI, "run"});
  LaunchResult r;
  {
    ChildProcess launcher(args, dir / "launcher.out");
    r.exit_code = launcher.wait_for(seconds(20)).value_or(-1);
  }
  r.output = testing::read_text(dir / "launcher.out");
  return r;
}

std::string run_id(const std::string& output) {
  static const std::regex line(R"(\[rank 0\] id=(\S+))");
  std::smatch m;
  return std::regex_search(output, m, line) ? m[1].str() : "";
}

// Workers get the job's id as TORCHELASTIC_RUN_ID, as under torchrun: derived from the command, so
// the same command gives the same id on every node, or --rdzv-id's.
TEST(LauncherJob, WorkersGetTheJobsIdDerivedFromTheCommandOrGiven) {
  TempDir dir;
  const std::vector<std::string> program{"--", "sh", "-c", "echo id=$TORCHELASTIC_RUN_ID", "lr", "0.02"};
  std::vector<std::string> args{"--nproc-per-node", "1"};
  args.insert(args.end(), program.begin(), program.end());
  const LaunchResult a = launch_run(dir, args), b = launch_run(dir, args);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_THAT(run_id(a.output), ::testing::MatchesRegex("[0-9a-f]{12}"));
  EXPECT_EQ(run_id(a.output), run_id(b.output));
  args.back() = "0.90";
  EXPECT_NE(run_id(launch_run(dir, args).output), run_id(a.output));
  args.insert(args.begin(), {"--rdzv-id", "job-7"});
  EXPECT_EQ(run_id(launch_run(dir, args).output), "job-7");
  const LaunchResult bad = launch_run(dir, {"--rdzv-id", "a b", "--", "true"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("--rdzv-id 'a b' may only hold letters, digits and . _ : -"));
}

// Issue 54 item 13: a rank that exited 0 before the others' rendezvous left them waiting until
// their timeout, and the launcher then named only the rank that timed out.
TEST(LauncherJob, ARankThatExitedEarlyIsNamedWhenTheOthersFail) {
  TempDir dir;
  const std::string left = dir / "left";
  const LaunchResult r = launch_run(dir, {"--nproc-per-node", "2", "--", "sh", "-c",
                          "if [ $RANK = 1 ]; then touch " + left + "; exit 0; fi; "
                          "while [ ! -e " + left + " ]; do sleep 0.05; done; sleep 0.5; "
                          "echo rendezvous timed out >&2; exit 3"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 0 (node 0, local rank 0, pid "));
  EXPECT_THAT(r.output, ::testing::ContainsRegex("rank 1 \\(local rank 1\\) had exited with code 0 [0-9.]+ s earlier, "
                                                 "while the other ranks ran: .*; look at rank 1 first"))
      << r.output;
}

}  // namespace
}  // namespace lockstep
