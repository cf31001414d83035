// `lockstep run` end to end: the real CLI starting real workers (sh scripts) on this host.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <regex>

#include "../test_util.h"
#include "lockstep/core/process.h"

namespace lockstep {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::ChildProcess;
using testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

struct Launch {
  int exit_code = -1;     // 128 + signal if the launcher died by one; -1 if it had to be killed
  std::string output;     // stdout and stderr
  double seconds = 0.0;
};

// Runs `lockstep ARGS...` to completion (killing it after `timeout`).
Launch launch(const TempDir& dir, std::vector<std::string> args, milliseconds timeout = seconds(20),
              const std::vector<std::string>& env = {}) {
  args.insert(args.begin(), LOCKSTEP_CLI);
  const auto start = std::chrono::steady_clock::now();
  const std::string out = dir / "launcher.out";
  Launch result;
  {
    ChildProcess launcher(args, out, env);
    result.exit_code = launcher.wait_for(timeout).value_or(-1);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.output = testing::read_text(out);
  return result;
}

std::vector<std::string> lines_starting_with(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  std::sort(out.begin(), out.end());
  return out;
}

// The pids written by workers as `echo $$ > DIR/pid.RANK` (and `echo $! > DIR/child.RANK`).
std::vector<pid_t> written_pids(const TempDir& dir, const std::string& stem, int n) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const std::string text = testing::read_text(dir / (stem + "." + std::to_string(r)));
    if (!text.empty()) pids.push_back(static_cast<pid_t>(std::stol(text)));
  }
  return pids;
}

bool all_dead(const std::vector<pid_t>& pids) {
  return std::none_of(pids.begin(), pids.end(), testing::process_alive);
}

// Shell for a worker that records its pid and a child's pid, then waits for its launcher's word.
std::string record_pids(const TempDir& dir) {
  return "sleep 60 & echo $! > " + dir.path() + "/child.$RANK; echo $$ > " + dir.path() + "/pid.$RANK; ";
}

TEST(Launcher, PrefixesEveryLineWithRankAndSetsRankVariables) {
  TempDir dir;
  Launch r = launch(dir, {"run", "--nproc-per-node", "3", "--", "sh", "-c", "echo $RANK $LOCAL_RANK $WORLD_SIZE"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(lines_starting_with(r.output, "[rank"),
              ::testing::ElementsAre("[rank 0] 0 0 3", "[rank 1] 1 1 3", "[rank 2] 2 2 3"));
  EXPECT_THAT(r.output, HasSubstr("all 3 workers finished successfully after 0 restarts"));
}

TEST(Launcher, SetsTheTorchrunVariablesAndThreadsPerWorker) {
  TempDir dir;
  const std::string script =
      "echo $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT $OMP_NUM_THREADS $LOCKSTEP_RESTART_COUNT";
  Launch r = launch(dir, {"run", "--nproc-per-node", "2", "--", "sh", "-c", script});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> lines = lines_starting_with(r.output, "[rank");
  ASSERT_EQ(lines.size(), 2u) << r.output;
  const std::regex expected(R"(\[rank [01]\] 2 0 127\.0\.0\.1 (\d+) (\d+) 0)");
  std::smatch m0, m1;
  ASSERT_TRUE(std::regex_match(lines[0], m0, expected)) << lines[0];
  ASSERT_TRUE(std::regex_match(lines[1], m1, expected)) << lines[1];
  EXPECT_EQ(m0[1], m1[1]) << "both ranks need the same MASTER_PORT";
  EXPECT_EQ(std::stoi(m0[2]), std::max(1, available_cores() / 2));

  Launch user = launch(dir, {"run", "--nproc-per-node", "2", "--", "sh", "-c", "echo $OMP_NUM_THREADS"},
                       seconds(20), {"OMP_NUM_THREADS=7"});
  EXPECT_THAT(lines_starting_with(user.output, "[rank"),
              ::testing::ElementsAre("[rank 0] 7", "[rank 1] 7"));
}

TEST(Launcher, LinesOfConcurrentWorkersNeverMix) {
  TempDir dir;
  // Each rank writes 300 lines of 200 characters as fast as it can, each line in two writes.
  const std::string script =
      "c=$(printf %0200d 0 | tr 0 $RANK); i=0; "
      "while [ $i -lt 300 ]; do printf %s $c; printf '\\n'; i=$((i+1)); done";
  Launch r = launch(dir, {"run", "--nproc-per-node", "2", "--", "sh", "-c", script});
  ASSERT_EQ(r.exit_code, 0) << r.output.substr(0, 2000);
  const std::regex whole(R"(\[rank ([01])\] (0{200}|1{200}))");
  int lines = 0;
  for (const std::string& line : lines_starting_with(r.output, "[rank")) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, whole)) << "mixed or cut line: " << line;
    EXPECT_EQ(m[1].str(), std::string(1, m[2].str()[0]));
    ++lines;
  }
  EXPECT_EQ(lines, 600);
}

TEST(Launcher, FailingWorkerStopsTheGroupAndIsNamedWithItsExitCode) {
  TempDir dir;
  // Rank 1 fails once every rank is up; rank 2 ignores SIGTERM, so only the SIGKILL after the grace
  // period ends it.
  const std::string script = record_pids(dir) +
                             "if [ $RANK = 1 ]; then "
                             "  while [ $(ls " + dir.path() + " | grep -c '^pid') -lt 3 ]; do sleep 0.02; done; "
                             "  echo 'out of cheese' >&2; exit 3; "
                             "fi; "
                             "if [ $RANK = 2 ]; then trap '' TERM; fi; wait";
  Launch r = launch(dir, {"run", "--nproc-per-node", "3", "--grace-period", "1", "--", "sh", "-c", script});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_THAT(r.output, HasSubstr("rank 1 (node 0, local rank 1, pid "));
  EXPECT_THAT(r.output, HasSubstr("exited with code 3"));
  EXPECT_THAT(r.output, HasSubstr("last 1 line of rank 1's stderr:\n  out of cheese"));
  std::vector<pid_t> pids = written_pids(dir, "pid", 3);
  const std::vector<pid_t> children = written_pids(dir, "child", 3);
  ASSERT_EQ(pids.size(), 3u);
  ASSERT_EQ(children.size(), 3u);
  pids.insert(pids.end(), children.begin(), children.end());
  EXPECT_TRUE(testing::wait_until([&] { return all_dead(pids); }, seconds(2)))
      << "a worker or its child outlived the launcher";
}

TEST(Launcher, WorkerKilledBySignalIsNamed) {
  TempDir dir;
  Launch r = launch(dir, {"run", "--nproc-per-node", "2", "--", "sh", "-c",
                          "if [ $RANK = 0 ]; then kill -SEGV $$; fi; sleep 30"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 0 (node 0, local rank 0, pid "));
  EXPECT_THAT(r.output, HasSubstr("was killed by SIGSEGV"));
}

// Shell that waits until process $1 has exited (a zombie, or already reaped). Busy-waits without
// sleeping, so that the caller exits within a millisecond or two of that process.
std::string until_exited(const std::string& pid_expression) {
  return "while s=$(cat /proc/" + pid_expression + "/stat 2>/dev/null) && "
         "[ \"$(echo \"$s\" | cut -d' ' -f3)\" != Z ]; do :; done; ";
}

// Rank 1 fails; rank 0 fails a moment later, as a rank does when a collective's peer vanishes.
// Both are usually found dead in the same pass, and the launcher named the lowest rank, rank 0.
// Rank 1 leaves a child holding its output pipes, so that no end-of-file wakes the launcher early.
// See Note [Which worker failed first].
TEST(Launcher, NamesTheRankThatFailedFirstNotTheLowest) {
  TempDir dir;
  const std::string script =
      "if [ $RANK = 1 ]; then sleep 30 & echo $$ > " + dir.path() + "/one.tmp; mv " + dir.path() +
      "/one.tmp " + dir.path() + "/one; exit 3; fi; "
      "while [ ! -e " + dir.path() + "/one ]; do sleep 0.01; done; " +
      until_exited("$(cat " + dir.path() + "/one)") + "exit 5";
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::filesystem::remove(dir / "one");
    Launch r = launch(dir, {"run", "--nproc-per-node", "2", "--grace-period", "1", "--", "sh", "-c", script});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_THAT(r.output, HasSubstr("lockstep run: failed: rank 1 (node 0, local rank 1, pid ")) << r.output;
    EXPECT_THAT(r.output, HasSubstr("exited with code 3")) << r.output;
    EXPECT_THAT(r.output, Not(HasSubstr("failed: rank 0"))) << r.output;
  }
}

// SIGSTOP rank 1: rank 0 (here: at once) gives up waiting for it, as a collective's timeout would.
// The launcher blamed rank 0 alone; it must point at the stopped rank.
TEST(Launcher, StoppedRankIsNamedWhenAnotherFails) {
  TempDir dir;
  const std::string script =
      "if [ $RANK = 1 ]; then echo $$ > " + dir.path() + "/one.tmp; mv " + dir.path() + "/one.tmp " +
      dir.path() + "/one; kill -STOP $$; exit 0; fi; "
      "while [ ! -e " + dir.path() + "/one ]; do sleep 0.01; done; "
      "while [ \"$(cut -d' ' -f3 /proc/$(cat " + dir.path() + "/one)/stat)\" != T ]; do sleep 0.01; done; "
      "echo 'all_reduce timed out' >&2; exit 1";
  Launch r = launch(dir, {"run", "--nproc-per-node", "2", "--grace-period", "1", "--", "sh", "-c", script});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_THAT(r.output, HasSubstr("rank 0 (node 0, local rank 0, pid "));
  EXPECT_THAT(r.output, HasSubstr("rank 1 (local rank 1, pid "));
  EXPECT_THAT(r.output, HasSubstr(") is stopped by SIGSTOP: a stopped rank never arrives at a collective, so "
                                  "the others time out waiting for it; look at rank 1 first"));
}

// Starts a launcher whose workers record their pids, and waits until all of them have.
class RunningLauncher {
 public:
  RunningLauncher(const TempDir& dir, int nproc, const std::string& script)
      : dir_(dir),
        nproc_(nproc),
        process_({LOCKSTEP_CLI, "run", "--nproc-per-node", std::to_string(nproc), "--grace-period", "2",
                  "--", "sh", "-c", record_pids(dir) + script},
                 dir / "launcher.out") {}

  bool workers_up() {
    return testing::wait_until(
        [&] { return written_pids(dir_, "pid", nproc_).size() == static_cast<size_t>(nproc_); }, seconds(10));
  }
  std::vector<pid_t> all_pids() const {
    std::vector<pid_t> pids = written_pids(dir_, "pid", nproc_);
    const std::vector<pid_t> children = written_pids(dir_, "child", nproc_);
    pids.insert(pids.end(), children.begin(), children.end());
    return pids;
  }
  ChildProcess& process() { return process_; }
  std::string output() const { return testing::read_text(dir_ / "launcher.out"); }

 private:
  const TempDir& dir_;
  int nproc_;
  ChildProcess process_;
};

TEST(Launcher, SigtermToLauncherEndsEveryWorker) {
  TempDir dir;
  RunningLauncher run(dir, 3, "wait");
  ASSERT_TRUE(run.workers_up()) << run.output();
  const std::vector<pid_t> pids = run.all_pids();
  ASSERT_EQ(::kill(run.process().pid(), SIGTERM), 0);
  const std::optional<int> code = run.process().wait_for(seconds(10));
  ASSERT_TRUE(code.has_value()) << "the launcher did not end after SIGTERM\n" << run.output();
  EXPECT_EQ(*code, 128 + SIGTERM) << run.output();
  EXPECT_THAT(run.output(), HasSubstr("received SIGTERM; forwarding it to 3 workers"));
  EXPECT_TRUE(testing::wait_until([&] { return all_dead(pids); }, seconds(2)));
}

TEST(Launcher, SigintToLauncherReachesEveryWorker) {
  TempDir dir;
  // Each worker proves it saw SIGINT itself by leaving a file and exiting cleanly.
  RunningLauncher run(dir, 2,
                      "trap 'echo > " + dir.path() + "/got-int.$RANK; exit 0' INT; "
                      "while :; do sleep 0.05; done");
  ASSERT_TRUE(run.workers_up()) << run.output();
  ASSERT_EQ(::kill(run.process().pid(), SIGINT), 0);
  const std::optional<int> code = run.process().wait_for(seconds(10));
  ASSERT_TRUE(code.has_value()) << run.output();
  EXPECT_EQ(*code, 128 + SIGINT);
  EXPECT_TRUE(std::filesystem::exists(dir / "got-int.0"));
  EXPECT_TRUE(std::filesystem::exists(dir / "got-int.1"));
  EXPECT_TRUE(testing::wait_until([&] { return all_dead(run.all_pids()); }, seconds(2)));
}

TEST(Launcher, WorkersDieWhenTheLauncherIsKilled) {
  TempDir dir;
  // SIGKILL leaves the launcher no chance to clean up; PR_SET_PDEATHSIG ends the workers it started.
  // (Their own children are beyond its reach in this case, hence `exec`.)
  RunningLauncher run(dir, 2, "exec sleep 60");
  ASSERT_TRUE(run.workers_up()) << run.output();
  const std::vector<pid_t> workers = written_pids(dir, "pid", 2);
  ASSERT_EQ(::kill(run.process().pid(), SIGKILL), 0);
  ASSERT_TRUE(run.process().wait_for(seconds(5)).has_value());
  EXPECT_TRUE(testing::wait_until([&] { return all_dead(workers); }, seconds(5)));
  for (pid_t child : written_pids(dir, "child", 2)) ::kill(child, SIGKILL);
}

TEST(Launcher, MaxRestartsRestartsTheGroupUntilItSucceeds) {
  TempDir dir;
  Launch r = launch(dir, {"run", "--nproc-per-node", "2", "--max-restarts", "2", "--", "sh", "-c",
                          "if [ $LOCKSTEP_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then exit 1; fi; "
                          "echo start $LOCKSTEP_RESTART_COUNT"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("restarting the worker group (restart 1 of 2)"));
  EXPECT_THAT(r.output, Not(HasSubstr("restart 2 of 2")));
  EXPECT_THAT(r.output, HasSubstr("all 2 workers finished successfully after 1 restart\n"));
  EXPECT_THAT(lines_starting_with(r.output, "[rank"),
              ::testing::IsSupersetOf({"[rank 0] start 1", "[rank 1] start 1"}));
}

TEST(Launcher, MaxRestartsGivesUpWhenAllAreUsed) {
  TempDir dir;
  Launch r = launch(dir, {"run", "--nproc-per-node", "2", "--max-restarts", "2", "--", "sh", "-c",
                          "exit $((RANK + 4))"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("restart 2 of 2"));
  EXPECT_THAT(r.output, HasSubstr("exited with code"));
  EXPECT_THAT(r.output, HasSubstr("(all 2 restarts used)"));
}

TEST(Launcher, LogDirKeepsEachRanksOutputPerAttempt) {
  TempDir dir;
  const std::string logs = dir / "logs";
  Launch r = launch(dir, {"run", "--nproc-per-node", "2", "--log-dir", logs, "--max-restarts", "1", "--",
                          "sh", "-c",
                          "echo out $RANK; echo err $RANK >&2; [ $LOCKSTEP_RESTART_COUNT = 1 ] || [ $RANK = 0 ]"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(testing::read_text(logs + "/attempt_0/rank_1.stdout"), "out 1\n");  // the failed attempt
  EXPECT_EQ(testing::read_text(logs + "/attempt_0/rank_1.stderr"), "err 1\n");
  EXPECT_EQ(testing::read_text(logs + "/attempt_1/rank_0.stdout"), "out 0\n");
  EXPECT_EQ(testing::read_text(logs + "/attempt_1/rank_1.stderr"), "err 1\n");
}

// --log-dir on a full disk: the rank files were cut short without a word. Run in a private mount
// namespace with a 16 KiB tmpfs as the log directory.
TEST(Launcher, LogDirOnAFullDiskIsReportedNamingTheFile) {
  if (::geteuid() != 0 || testing::run_command("command -v unshare").exit_code != 0)
    GTEST_SKIP() << "needs root and unshare(1) to mount a small tmpfs in a private mount namespace";
  TempDir dir;
  const std::string logs = dir / "logs";
  std::filesystem::create_directories(logs);
  const std::string command = "unshare -m sh -c 'mount -t tmpfs -o size=16k none " + logs + " && exec " +
                              LOCKSTEP_CLI + " run --log-dir " + logs +
                              " -- sh -c \"i=0; while [ \\$i -lt 2000 ]; do echo line \\$i of some length; "
                              "i=\\$((i + 1)); done\"'";
  auto r = testing::run_command(command);
  EXPECT_EQ(r.exit_code, 0) << r.output.substr(0, 2000);
  EXPECT_THAT(r.output, ::testing::ContainsRegex("lockstep run: cannot write " + logs +
                                                 "/attempt_0/rank_0.stdout: No space left on device \\(errno 28\\); "
                                                 "the file holds only the first [0-9]+ bytes of this output"));
  EXPECT_THAT(r.output, HasSubstr("[rank 0] line 1999 of some length"));  // the console has it all
}

// CLI11 reads '[a b]' and '[1,2]' as lists and splits them; after "--" nothing may be rewritten.
TEST(Launcher, ProgramArgumentsReachTheWorkerByteForByte) {
  TempDir dir;
  const std::vector<std::string> given{"[a b]", "[1,2]", "", "'single'", "\"double\"", "a,b",
                                       "  spaced  ", "{}", "[", "]", "--", "--nproc-per-node", "-h",
                                       "run", "tab\there", "ünï"};
  std::vector<std::string> args{"run", "--", "sh", "-c", "for a in \"$@\"; do printf '<%s>\\n' \"$a\"; done",
                                "sh"};
  args.insert(args.end(), given.begin(), given.end());
  Launch r = launch(dir, args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> seen;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("[rank 0] <", 0) == 0) seen.push_back(line.substr(10, line.size() - 11));
  EXPECT_EQ(seen, given) << r.output;

  // The program itself may look like a list, as a shell test does.
  r = launch(dir, {"run", "--", "sh", "-c", "[ \"$RANK\" -ge 0 ]"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // "--" belongs to `lockstep run` only.
  r = launch(dir, {"train", "--", "x"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("are for `lockstep run -- PROGRAM [ARGS...]`"));
}

TEST(Launcher, RejectsBadCommandLinesNamingTheValue) {
  TempDir dir;
  Launch r = launch(dir, {"run", "--nproc-per-node", "0", "--", "true"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--nproc-per-node must be at least 1, got 0"));
  r = launch(dir, {"run", "--nproc-per-node", "2x", "--", "true"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("lockstep: error: --nproc-per-node '2x' is not a number of workers, nor gpu, cpu"));
  r = launch(dir, {"run", "--nnodes", "2", "--node-rank", "2", "--", "true"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--node-rank 2 is outside [0, 2)"));
  r = launch(dir, {"run", "--nproc-per-node", "2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("no program to run"));
  r = launch(dir, {"run", "--", "no-such-program-lockstep"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("'no-such-program-lockstep' is not an executable file"));
  r = launch(dir, {"run", "--standalone", "--nnodes", "2", "--", "true"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--nnodes is 2"));
}

// Out-of-range durations and counts are refused before any worker starts, naming the flag, the
// value as given and the allowed range. See Note [Launcher bounds].
struct BadBound {
  std::vector<std::string> flags;
  std::string expected;  // the start of the message
};

void PrintTo(const BadBound& b, std::ostream* os) {
  for (const std::string& f : b.flags) *os << f << " ";
}

class LauncherRefusesOutOfRange : public ::testing::TestWithParam<BadBound> {};

TEST_P(LauncherRefusesOutOfRange, BeforeStartingAnythingNamingValueAndRange) {
  TempDir dir;
  std::vector<std::string> args{"run"};
  args.insert(args.end(), GetParam().flags.begin(), GetParam().flags.end());
  for (const char* word : {"--", "touch"}) args.push_back(word);
  args.push_back(dir / "started");
  Launch r = launch(dir, args, seconds(10));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_LT(r.seconds, 5.0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(GetParam().expected)) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "started"));
}

INSTANTIATE_TEST_SUITE_P(
    Launcher, LauncherRefusesOutOfRange,
    ::testing::Values(
        // 0.0005 s is 0 ms, which c10d reads as "no timeout": it waited forever.
        BadBound{{"--rdzv-timeout", "0.0005"},
                 "--rdzv-timeout 0.0005 is out of range: it must be a number of seconds in [0.001, 604800]"},
        BadBound{{"--rdzv-timeout", "inf"}, "--rdzv-timeout inf is out of range"},
        BadBound{{"--rdzv-timeout", "1e300"}, "--rdzv-timeout 1e+300 is out of range"},
        BadBound{{"--rdzv-timeout", "nan"}, "--rdzv-timeout nan is out of range"},
        // inf seconds overflowed to a negative grace period: workers were SIGKILLed at once.
        BadBound{{"--grace-period", "inf"},
                 "--grace-period inf is out of range: it must be a number of seconds in [0, 604800]"},
        BadBound{{"--grace-period", "-1"}, "--grace-period -1 is out of range"},
        // Every worker's environment was built before the first fork, until the OOM killer came.
        BadBound{{"--nproc-per-node", "99999999999"},
                 "--nproc-per-node 99999999999 is out of range: it must be in [1, 1024]; start one "
                 "worker per device or core"},
        BadBound{{"--max-restarts", "99999999999"}, "--max-restarts 99999999999 is out of range"},
        BadBound{{"--nnodes", "99999999999"}, "--nnodes 99999999999 is out of range"}));

TEST(Launcher, RendezvousTimeoutSaysHowManyNodesArrived) {
  TempDir dir;
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  Launch r = launch(dir, {"run", "--nnodes", "3", "--node-rank", "0", "--master-port", std::to_string(port),
                          "--rdzv-timeout", "1", "--", "true"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_THAT(r.output, HasSubstr("rendezvous timed out after 1 s: 1 of 3 nodes arrived"));
  EXPECT_THAT(r.output, HasSubstr("missing: 1, 2"));
}

}  // namespace
}  // namespace lockstep
