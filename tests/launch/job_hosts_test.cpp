// Jobs that must not silently merge or split (issue 54 items 3, 4, 5, 9), on network-namespace hosts:
// nodes of one job that run different commands, a second job pointed at the first, a leader
// stopped past the heartbeat timeout and woken, and an endpoint that accepts and never answers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <regex>

#include "../test_util.h"
#include "namespaces.h"

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::seconds;
using testing::ChildProcess;
using testing::NamespaceHosts;
using testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// `lockstep run ARGS` on `host`, its output in DIR/NAME.out.
std::unique_ptr<ChildProcess> launch(const NamespaceHosts& hosts, int host, const TempDir& dir, const std::string& name,
                                     const std::vector<std::string>& args) {
  std::vector<std::string> argv = hosts.exec(host);
  argv.insert(argv.end(), {LOCKSTEP_CLI, "run"});
  argv.insert(argv.end(), args.begin(), args.end());
  return std::make_unique<ChildProcess>(argv, dir / (name + ".out"));
}

bool says(const TempDir& dir, const std::string& name, const std::string& what) {
  return testing::read_text(dir / (name + ".out")).find(what) != std::string::npos;
}

#define NAMESPACE_HOSTS(hosts, n)                                                                     \
  if (const std::string why = testing::namespaces_unavailable(); !why.empty()) GTEST_SKIP() << why;  \
  NamespaceHosts hosts(n);                                                                            \
  if (!hosts.error().empty()) GTEST_SKIP() << "cannot create network namespaces here: " << hosts.error()

// Item 3: node 0 ran `--lr 0.02`, node 1 `--lr 0.90`; both succeeded, each rank with its own rate.
TEST(JobHosts, NodesOfOneJobWhoseArgumentsDifferBothFailAtOnceNamingTheArgument) {
  NAMESPACE_HOSTS(hosts, 2);
  TempDir dir;
  const auto start = Clock::now();
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int n = 0; n < 2; ++n)
    nodes.push_back(launch(hosts, n, dir, "node" + std::to_string(n),
                           {"--nnodes", "2", "--node-rank", std::to_string(n), "--master-addr", hosts.address(0),
                            "--rdzv-timeout", "30", "--", "sh", "-c", "touch " + (dir / "trained.$RANK"), "lr",
                            n == 0 ? "0.02" : "0.90"}));
  for (int n = 0; n < 2; ++n) {
    const std::string name = "node" + std::to_string(n);
    EXPECT_EQ(nodes[n]->wait_for(seconds(20)).value_or(-1), 1) << testing::read_text(dir / (name + ".out"));
    const std::string out = testing::read_text(dir / (name + ".out"));
    EXPECT_THAT(out, HasSubstr("nodes disagree on the job: argument 4 of the program is '0.")) << out;
    EXPECT_THAT(out, HasSubstr("'0.90' on node 1")) << out;
    EXPECT_THAT(out, HasSubstr("'0.02' on node 0")) << out;
  }
  EXPECT_LT(since(start), 15.0);
  EXPECT_FALSE(std::filesystem::exists(dir / "trained.0"));
  EXPECT_FALSE(std::filesystem::exists(dir / "trained.1"));
}

// Item 4: two elastic jobs pointed at one endpoint merged into one world ("JOB-X rank 0 of 2",
// "JOB-Y rank 1 of 2"). The newcomer is refused; the running job goes on alone.
TEST(JobHosts, ASecondElasticJobOnTheFirstsEndpointIsRefusedAndTheFirstGoesOn) {
  NAMESPACE_HOSTS(hosts, 2);
  TempDir dir;
  const std::string release = dir / "release";
  auto job = [&](int host, const std::string& name) {
    return launch(hosts, host, dir, name,
                  {"--nnodes", "1:2", "--rdzv-endpoint", hosts.address(0), "--rdzv-last-call", "0.5",
                   "--rdzv-timeout", "20", "--heartbeat-timeout", "5", "--", "sh", "-c",
                   "echo " + name + " rank $RANK of $WORLD_SIZE; while [ ! -e " + release + " ]; do sleep 0.1; done"});
  };
  std::unique_ptr<ChildProcess> x = job(0, "JOB-X");
  ASSERT_TRUE(testing::wait_until([&] { return says(dir, "JOB-X", "JOB-X rank 0 of 1"); }, seconds(20)))
      << testing::read_text(dir / "JOB-X.out");
  std::unique_ptr<ChildProcess> y = job(1, "JOB-Y");
  EXPECT_EQ(y->wait_for(seconds(20)).value_or(-1), 1) << testing::read_text(dir / "JOB-Y.out");
  EXPECT_TRUE(says(dir, "JOB-Y", "is not of the job of the launcher it reached: argument 2 of the program is"))
      << testing::read_text(dir / "JOB-Y.out");
  EXPECT_FALSE(x->wait_for(seconds(0)).has_value()) << "job X must go on";
  std::ofstream(release).put('\n');
  EXPECT_EQ(x->wait_for(seconds(20)).value_or(-1), 0) << testing::read_text(dir / "JOB-X.out");
  EXPECT_FALSE(says(dir, "JOB-X", "of 2")) << testing::read_text(dir / "JOB-X.out");
  EXPECT_FALSE(says(dir, "JOB-Y", "] JOB-Y rank")) << testing::read_text(dir / "JOB-Y.out");  // no worker ran
}

// Item 5: the leader's launcher SIGSTOPped past the heartbeat timeout, then SIGCONT: the other node
// went on alone and the woken leader formed a second world of its own. It must rejoin the others.
TEST(JobHosts, ALeaderStoppedPastTheHeartbeatRejoinsTheOthersAsANewcomer) {
  NAMESPACE_HOSTS(hosts, 2);
  TempDir dir;
  const std::string woken = dir / "woken";
  // Workers finish once the leader has been woken and both nodes are one world again.
  const std::string program = "echo world $WORLD_SIZE; while true; do if [ -e " + woken +
                              " ] && [ $WORLD_SIZE = 2 ]; then exit 0; fi; sleep 0.1; done";
  auto node = [&](int host) {
    return launch(hosts, host, dir, "node" + std::to_string(host),
                  {"--nnodes", "1:2", "--rdzv-endpoint", hosts.address(0) + "," + hosts.address(1),
                   "--rdzv-last-call", "1", "--rdzv-timeout", "30", "--heartbeat-timeout", "3", "--grace-period", "1",
                   "--max-restarts", "3", "--", "sh", "-c", program});
  };
  std::unique_ptr<ChildProcess> leader = node(0);
  ASSERT_TRUE(testing::wait_until([&] { return says(dir, "node0", "round 0: node 0 of 1"); }, seconds(20)))
      << testing::read_text(dir / "node0.out");
  std::unique_ptr<ChildProcess> other = node(1);
  ASSERT_TRUE(testing::wait_until([&] { return says(dir, "node1", ": node 1 of 2"); }, seconds(30)))
      << testing::read_text(dir / "node0.out") << testing::read_text(dir / "node1.out");
  ASSERT_EQ(::kill(leader->pid(), SIGSTOP), 0);
  // The other node declares the silent leader gone and forms a round of its own.
  const bool alone = testing::wait_until([&] { return says(dir, "node1", ": node 0 of 1"); }, seconds(30));
  std::ofstream(woken).put('\n');
  ::kill(leader->pid(), SIGCONT);
  ASSERT_TRUE(alone) << testing::read_text(dir / "node1.out") << "--- node 0\n" << testing::read_text(dir / "node0.out");
  const std::optional<int> leader_code = leader->wait_for(seconds(60));
  const std::optional<int> other_code = other->wait_for(seconds(30));
  const std::string out0 = testing::read_text(dir / "node0.out"), out1 = testing::read_text(dir / "node1.out");
  EXPECT_EQ(leader_code.value_or(-1), 0) << out0;
  EXPECT_EQ(other_code.value_or(-1), 0) << out1;
  EXPECT_THAT(out0, HasSubstr("node 0's launcher did not run for")) << out0;
  EXPECT_THAT(out0, HasSubstr("it joins them again as a newcomer")) << out0;
  // After waking, the old leader's only round is the survivors' larger one: never "node 0 of 1".
  const std::string after = out0.substr(out0.find("did not run for"));
  EXPECT_THAT(after, Not(HasSubstr(" of 1, ranks"))) << out0;
  EXPECT_THAT(after, HasSubstr(": node 1 of 2")) << out0;
  EXPECT_THAT(out0 + out1, Not(HasSubstr("Exception raised from"))) << "no C++ backtrace";
}

// Item 9: an --rdzv-endpoint that accepts TCP and never answers, listed before the live leader,
// kept a node waiting past 150 s with --rdzv-timeout 5.
TEST(JobHosts, AnEndpointThatAcceptsAndNeverAnswersIsPassedOverForTheLiveLeader) {
  NAMESPACE_HOSTS(hosts, 3);
  TempDir dir;
  // Host 2 holds the launchers' port with a program that accepts connections and never answers.
  const std::string listen = "import socket\ns = socket.socket(); s.bind(('0.0.0.0', 29501)); s.listen(16)\n"
                             "open('" + (dir / "listening") + "', 'w').close()\nconns = []\n"
                             "while True: conns.append(s.accept())\n";
  std::vector<std::string> silent = hosts.exec(2);
  silent.insert(silent.end(), {"python3", "-c", listen});
  ChildProcess listener(silent, dir / "silent.out");
  ASSERT_TRUE(testing::wait_until([&] { return std::filesystem::exists(dir / "listening"); }, seconds(10)))
      << testing::read_text(dir / "silent.out");
  const std::string program = "echo world $WORLD_SIZE; [ $WORLD_SIZE = 2 ] || sleep 60";
  std::unique_ptr<ChildProcess> leader =
      launch(hosts, 0, dir, "node0",
             {"--nnodes", "1:2", "--rdzv-endpoint", hosts.address(0), "--rdzv-last-call", "0.5", "--rdzv-timeout",
              "30", "--grace-period", "1", "--", "sh", "-c", program});
  ASSERT_TRUE(testing::wait_until([&] { return says(dir, "node0", "world 1"); }, seconds(20)))
      << testing::read_text(dir / "node0.out");
  const auto start = Clock::now();
  std::unique_ptr<ChildProcess> joiner =
      launch(hosts, 1, dir, "node1",
             {"--nnodes", "1:2", "--rdzv-endpoint", hosts.address(2) + "," + hosts.address(0), "--rdzv-last-call",
              "0.5", "--rdzv-timeout", "10", "--grace-period", "1", "--", "sh", "-c", program});
  const std::optional<int> joined = joiner->wait_for(seconds(30));
  const std::string out1 = testing::read_text(dir / "node1.out");
  EXPECT_EQ(joined.value_or(-1), 0) << out1;
  EXPECT_LT(since(start), 20.0) << out1;
  EXPECT_THAT(out1, HasSubstr("world 2")) << out1;
  EXPECT_EQ(leader->wait_for(seconds(20)).value_or(-1), 0) << testing::read_text(dir / "node0.out");
}

}  // namespace
}  // namespace lockstep
