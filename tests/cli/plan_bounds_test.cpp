// `lockstep plan` at absurd sizes (issue 54 items 10 and 15): a summary for many ranks, and
// refusals naming the flag, its value and the bound, each in well under the time the plan took.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "../test_util.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

const std::string kCli = LOCKSTEP_CLI;

struct Timed {
  testing::CommandResult result;
  double seconds = 0.0;
};

// `timeout` bounds what the code before the fix did (minutes, gigabytes) to a failure.
Timed plan(const std::string& args) {
  const auto start = Clock::now();
  Timed t{testing::run_command("timeout 30 " + kCli + " plan " + args), 0.0};
  t.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return t;
}

// 10^6 ranks of ddp hold the same: printed as one line of ranks. Before: a million rank lines.
TEST(PlanBounds, AMillionRanksPrintAsOneLine) {
  const Timed t = plan("--model mlp --data synthetic --limit 64 --world-size 1000000 --nproc-per-node 8");
  ASSERT_EQ(t.result.exit_code, 0) << t.result.output.substr(0, 2000);
  EXPECT_EQ(std::count(t.result.output.begin(), t.result.output.end(), '\n'), 3) << t.result.output.substr(0, 2000);
  EXPECT_THAT(t.result.output, HasSubstr("ddp at O0, batch 100 per rank, 1000000 ranks; MiB\nranks 0-999999: parameters "));
  EXPECT_THAT(t.result.output, HasSubstr("\nlargest: ranks 0-999999, "));
  EXPECT_LT(t.seconds, 15.0);  // LibTorch's start and one rank's dry runs, on a loaded host
}

// Before: no answer in 60 s, 2.3-7 GB.
TEST(PlanBounds, AWorldPastTheLargestJobIsRefusedNamingTheFlagAndTheBound) {
  const Timed t = plan("--world-size 1000000000");
  EXPECT_EQ(t.result.exit_code, 2) << t.result.output;
  EXPECT_THAT(t.result.output,
              HasSubstr("lockstep: error: --world-size 1000000000 is more ranks than lockstep runs (at most 1048576, 2^20)"));
  EXPECT_LT(t.seconds, 5.0);
}

// Before: the powers-of-two loop doubled 2^62 into a negative number and went on (16.9 GB); ranks
// per host near 2^63 printed ranks -2, -4 and a row of 0 ranks at 100.0%.
TEST(PlanBounds, ClustersPastTheLargestJobAreRefusedBeforeAnyProduct) {
  const Timed hosts = plan("--nodes 4611686018427387904 --profile-log /nonexistent/run.jsonl");
  EXPECT_EQ(hosts.result.exit_code, 2) << hosts.result.output;
  EXPECT_THAT(hosts.result.output, HasSubstr("lockstep: error: a cluster of 4611686018427387904 hosts (--nodes) x 1 "
                                             "ranks per host (--ranks-per-node) is not a job lockstep runs: each must "
                                             "be at least 1 and their product at most 1048576 ranks"));
  EXPECT_LT(hosts.seconds, 5.0);
  const Timed ranks = plan("--nodes 128 --ranks-per-node 9223372036854775807 --profile-log /nonexistent/run.jsonl");
  EXPECT_EQ(ranks.result.exit_code, 2) << ranks.result.output;
  EXPECT_THAT(ranks.result.output, HasSubstr("128 hosts (--nodes) x 9223372036854775807 ranks per host"));
  EXPECT_THAT(ranks.result.output, Not(HasSubstr("| -")));
}

// Before: the plan tokenised the corpus and built a model with a position table of 10^9 rows
// (5.8 GB, more than 60 s) before it advised a smaller batch. The corpus does not even exist here:
// the refusal comes first.
TEST(PlanBounds, AModelThatCannotFitIsRefusedBeforeItIsBuilt) {
  const Timed t = plan("--model gpt-mini --data text:/nonexistent/corpus.txt --max-length 1000000000");
  EXPECT_EQ(t.result.exit_code, 2) << t.result.output;
  EXPECT_THAT(t.result.output, HasSubstr("lockstep: error: gpt-mini with --n-layer 4, --n-embd 256 and --max-length "
                                         "1000000000 has at least 256003159552 parameters"));
  EXPECT_THAT(t.result.output, HasSubstr("MiB each rank may use ("));
  EXPECT_THAT(t.result.output, HasSubstr("Lower --max-length"));
  EXPECT_LT(t.seconds, 5.0);
}

}  // namespace
}  // namespace lockstep
