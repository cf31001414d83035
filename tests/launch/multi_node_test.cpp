// Several launchers forming one job, as on several nodes: on loopback, and in two network
// namespaces joined by a veth pair when this process may create them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "../test_util.h"
#include "namespaces.h"

namespace lockstep {
namespace {

using std::chrono::seconds;
using testing::ChildProcess;
using testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// Every rank adds rank + 1 with Gloo over the workers' MASTER_ADDR/MASTER_PORT: proof that the
// variables describe a working group and that the launchers' own store does not take the port.
constexpr const char* kGlooAllReduce = R"(
import datetime, os, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
print("rank", dist.get_rank(), "of", dist.get_world_size(), "sum", int(t.item()))
dist.destroy_process_group()
)";

struct NodeResult {
  int exit_code = -1;
  std::string output;
};

// Starts one launcher per entry of `prefixes` (a command to run it under, e.g. `ip netns exec NS`)
// as node 0, 1, ... with `common` options, and waits for all of them.
std::vector<NodeResult> run_nodes(const TempDir& dir, const std::vector<std::vector<std::string>>& prefixes,
                                  const std::vector<std::string>& common,
                                  const std::vector<std::vector<std::string>>& env = {}) {
  std::vector<std::unique_ptr<ChildProcess>> launchers;
  for (size_t n = 0; n < prefixes.size(); ++n) {
    std::vector<std::string> argv = prefixes[n];
    argv.insert(argv.end(), {LOCKSTEP_CLI, "run", "--nnodes", std::to_string(prefixes.size()), "--node-rank",
                             std::to_string(n)});
    argv.insert(argv.end(), common.begin(), common.end());
    launchers.push_back(std::make_unique<ChildProcess>(argv, dir / ("node" + std::to_string(n) + ".out"),
                                                       n < env.size() ? env[n] : std::vector<std::string>{}));
  }
  std::vector<NodeResult> results;
  for (size_t n = 0; n < launchers.size(); ++n) {
    NodeResult r;
    r.exit_code = launchers[n]->wait_for(seconds(30)).value_or(-1);
    r.output = testing::read_text(dir / ("node" + std::to_string(n) + ".out"));
    results.push_back(r);
  }
  return results;
}

std::vector<std::string> rank_lines(const std::vector<NodeResult>& nodes) {
  std::vector<std::string> out;
  for (const NodeResult& node : nodes) {
    std::istringstream in(node.output);
    for (std::string line; std::getline(in, line);)  // PyTorch 2.x's c10d logs "[rank N] [W1128 ...] ..." warnings
      if (line.rfind("[rank", 0) == 0 && line.find("] [W") == std::string::npos) out.push_back(line);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> options(int port, std::vector<std::string> rest) {
  std::vector<std::string> o{"--master-port", std::to_string(port), "--nproc-per-node", "2", "--rdzv-timeout", "20"};
  o.insert(o.end(), rest.begin(), rest.end());
  return o;
}

TEST(MultiNode, TwoLaunchersOnLoopbackGiveRanksZeroToThree) {
  TempDir dir;
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  auto nodes = run_nodes(dir, {{}, {}},
                         options(port, {"--", "sh", "-c", "echo $RANK $WORLD_SIZE $GROUP_RANK $LOCAL_RANK"}));
  ASSERT_EQ(nodes[0].exit_code, 0) << nodes[0].output;
  ASSERT_EQ(nodes[1].exit_code, 0) << nodes[1].output;
  EXPECT_THAT(rank_lines(nodes), ElementsAre("[rank 0] 0 4 0 0", "[rank 1] 1 4 0 1", "[rank 2] 2 4 1 0",
                                             "[rank 3] 3 4 1 1"));
}

TEST(MultiNode, WorkersOfTwoLaunchersFormOneGlooGroup) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  TempDir dir;
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  auto nodes = run_nodes(dir, {{}, {}}, options(port, {"--", python, "-c", kGlooAllReduce}));
  ASSERT_EQ(nodes[0].exit_code, 0) << nodes[0].output;
  ASSERT_EQ(nodes[1].exit_code, 0) << nodes[1].output;
  EXPECT_THAT(rank_lines(nodes), ElementsAre("[rank 0] rank 0 of 4 sum 10", "[rank 1] rank 1 of 4 sum 10",
                                             "[rank 2] rank 2 of 4 sum 10", "[rank 3] rank 3 of 4 sum 10"));
}

TEST(MultiNode, FailureOnOneNodeStopsTheOther) {
  TempDir dir;
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  // Rank 3 (node 1) fails once all four ranks are up; the others would wait for a minute.
  const std::string script = "echo $$ > " + dir.path() + "/pid.$RANK; "
                             "if [ $RANK = 3 ]; then "
                             "  while [ $(ls " + dir.path() + " | grep -c '^pid') -lt 4 ]; do sleep 0.02; done; "
                             "  exit 3; "
                             "fi; exec sleep 60";
  const auto start = std::chrono::steady_clock::now();
  auto nodes = run_nodes(dir, {{}, {}}, options(port, {"--grace-period", "1", "--", "sh", "-c", script}));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  EXPECT_EQ(nodes[1].exit_code, 1) << nodes[1].output;
  EXPECT_THAT(nodes[1].output, HasSubstr("rank 3 (node 1, local rank 1, pid "));
  EXPECT_EQ(nodes[0].exit_code, 1) << nodes[0].output;
  EXPECT_THAT(nodes[0].output, HasSubstr("another node failed: rank 3 (node 1, local rank 1"));
  EXPECT_THAT(nodes[0].output, HasSubstr("exited with code 3"));
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r) pids.push_back(std::stoi(testing::read_text(dir / ("pid." + std::to_string(r)))));
  EXPECT_TRUE(testing::wait_until(
      [&] { return std::none_of(pids.begin(), pids.end(), testing::process_alive); }, seconds(2)));
}

// Rank 1 (node 1) fails; rank 0 (node 0) fails after node 1's launcher has reported it. Node 0
// ended with "failed: rank 0 ...", its own, later failure; the first failure is rank 1's.
TEST(MultiNode, BothNodesNameTheFirstFailureOfTheJob) {
  TempDir dir;
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  const std::string script = "echo $$ > " + dir.path() + "/pid.$RANK; "
                             "if [ $RANK = 1 ]; then "
                             "  while [ ! -e " + dir.path() + "/pid.0 ]; do sleep 0.01; done; exit 7; "
                             "fi; "
                             "until grep -q 'rank 1 (node 1' " + dir.path() + "/node1.out; do sleep 0.01; done; "
                             "exit 5";
  auto nodes = run_nodes(dir, {{}, {}},
                         {"--master-port", std::to_string(port), "--rdzv-timeout", "20", "--grace-period", "1",
                          "--", "sh", "-c", script});
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(nodes[n].exit_code, 1) << nodes[n].output;
    EXPECT_THAT(nodes[n].output, HasSubstr("lockstep run: failed: rank 1 (node 1, local rank 0, pid "))
        << "node " << n << ":\n" << nodes[n].output;
    EXPECT_THAT(nodes[n].output, Not(HasSubstr("failed: rank 0"))) << nodes[n].output;
  }
}

// Node 0 with --nnodes 2, node 1 with --nnodes 3: node 1 waited for a third node until its
// rendezvous timeout while node 0 started workers into a group that never formed (~300 s).
// See Note [Nodes agree on the job]. Both orders of arrival are tried.
TEST(MultiNode, NodesThatDisagreeOnNnodesBothFailAtOnceNamingBothValues) {
  for (int first : {0, 1}) {
    TempDir dir;
    const int port = testing::free_port_pair();
    ASSERT_NE(port, 0);
    auto node = [&](int rank, int nnodes) {
      return std::make_unique<ChildProcess>(
          std::vector<std::string>{LOCKSTEP_CLI, "run", "--nnodes", std::to_string(nnodes), "--node-rank",
                                   std::to_string(rank), "--master-port", std::to_string(port),
                                   "--rdzv-timeout", "60", "--", "touch", dir / ("started." + std::to_string(rank))},
          dir / ("node" + std::to_string(rank) + ".out"));
    };
    const auto start = std::chrono::steady_clock::now();
    std::unique_ptr<ChildProcess> a = first == 0 ? node(0, 2) : node(1, 3);
    std::unique_ptr<ChildProcess> b = first == 0 ? node(1, 3) : node(0, 2);
    const std::optional<int> code_a = a->wait_for(seconds(20));
    const std::optional<int> code_b = b->wait_for(seconds(20));
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 15.0);
    for (int rank : {0, 1}) {
      const std::string out = testing::read_text(dir / ("node" + std::to_string(rank) + ".out"));
      EXPECT_EQ((rank == first ? code_a : code_b).value_or(-1), 1) << "node " << rank << ":\n" << out;
      EXPECT_THAT(out, HasSubstr("nodes disagree on the job: node "));
      EXPECT_THAT(out, HasSubstr("--nnodes 3")) << out;
      EXPECT_THAT(out, HasSubstr("--nnodes 2")) << out;
      EXPECT_THAT(out, HasSubstr("start every node with the same --nnodes")) << out;
      EXPECT_FALSE(std::filesystem::exists(dir / ("started." + std::to_string(rank))));
    }
  }
}

// `-- sh -c 'a b'` on one host and `-- sh -c a b` on another: a quoting slip made the nodes run
// different programs in one group.
TEST(MultiNode, NodesWhoseProgramsDifferInWordCountBothFailNamingBothCounts) {
  TempDir dir;
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int n = 0; n < 2; ++n) {
    std::vector<std::string> argv{LOCKSTEP_CLI, "run", "--nnodes", "2", "--node-rank", std::to_string(n),
                                  "--master-port", std::to_string(port), "--rdzv-timeout", "60", "--",
                                  "touch", dir / ("started." + std::to_string(n))};
    if (n == 1) argv.push_back(dir / "extra");
    nodes.push_back(std::make_unique<ChildProcess>(argv, dir / ("node" + std::to_string(n) + ".out")));
  }
  for (int n = 0; n < 2; ++n) {
    const std::optional<int> code = nodes[n]->wait_for(seconds(15));
    const std::string out = testing::read_text(dir / ("node" + std::to_string(n) + ".out"));
    EXPECT_EQ(code.value_or(-1), 1) << out;
    EXPECT_THAT(out, HasSubstr("nodes disagree on the job: node "));
    EXPECT_THAT(out, ::testing::ContainsRegex("runs a program of [23] words \\(PROGRAM and its arguments\\) "
                                              "but node [01] one of [23]; give every node the same PROGRAM"))
        << out;
    EXPECT_FALSE(std::filesystem::exists(dir / ("started." + std::to_string(n))));
  }
}

TEST(MultiNode, RestartAfterAFailureRestartsEveryNode) {
  TempDir dir;
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  auto nodes = run_nodes(dir, {{}, {}},
                         options(port, {"--max-restarts", "1", "--", "sh", "-c",
                                        "if [ $LOCKSTEP_RESTART_COUNT = 0 ] && [ $RANK = 3 ]; then exit 3; fi; "
                                        "echo $RANK of $WORLD_SIZE attempt $LOCKSTEP_RESTART_COUNT"}));
  for (const NodeResult& node : nodes) {
    EXPECT_EQ(node.exit_code, 0) << node.output;
    EXPECT_THAT(node.output, HasSubstr("restarting the worker group (restart 1 of 1)"));
    EXPECT_THAT(node.output, HasSubstr("all 4 workers finished successfully after 1 restart\n"));
  }
  EXPECT_THAT(rank_lines(nodes), ::testing::IsSupersetOf({"[rank 0] 0 of 4 attempt 1", "[rank 1] 1 of 4 attempt 1",
                                                          "[rank 2] 2 of 4 attempt 1", "[rank 3] 3 of 4 attempt 1"}));
}

TEST(MultiNode, TwoNetworkNamespacesJoinedByVethFormOneJob) {
  if (const std::string why = testing::namespaces_unavailable(); !why.empty()) GTEST_SKIP() << why;
  testing::NamespacePair ns;
  if (!ns.error().empty()) GTEST_SKIP() << "cannot create network namespaces here: " << ns.error();
  TempDir dir;
  const std::string master = testing::NamespacePair::kAddresses[0];
  // Fresh namespaces have every port free, so PyTorch's default port is safe.
  const std::string python = testing::python_with_torch();
  const std::vector<std::string> program =
      python.empty() ? std::vector<std::string>{"sh", "-c", "echo rank $RANK of $WORLD_SIZE"}
                     : std::vector<std::string>{python, "-c", kGlooAllReduce};
  std::vector<std::string> common{"--master-addr", master, "--master-port", "29500", "--nproc-per-node", "2",
                                  "--rdzv-timeout", "20", "--"};
  common.insert(common.end(), program.begin(), program.end());
  // Gloo picks its interface by host name otherwise, which resolves outside the namespaces.
  auto nodes = run_nodes(dir, {ns.exec(0), ns.exec(1)}, common,
                         {{"GLOO_SOCKET_IFNAME=" + ns.device(0)}, {"GLOO_SOCKET_IFNAME=" + ns.device(1)}});
  ASSERT_EQ(nodes[0].exit_code, 0) << nodes[0].output;
  ASSERT_EQ(nodes[1].exit_code, 0) << nodes[1].output;
  const std::vector<std::string> lines = rank_lines(nodes);
  ASSERT_EQ(lines.size(), 4u) << nodes[0].output << nodes[1].output;
  for (int r = 0; r < 4; ++r) {
    const std::string expected = "[rank " + std::to_string(r) + "] rank " + std::to_string(r) + " of 4";
    EXPECT_EQ(lines[r].substr(0, expected.size()), expected);
    if (!python.empty()) EXPECT_THAT(lines[r], ::testing::EndsWith("sum 10"));
  }
}

// Gloo binds the address the host name resolves to unless told an interface, and inside these
// namespaces the host name resolves outside them. `lockstep run --iface` hands each node's veth to
// its workers (LOCKSTEP_SOCKET_IFNAME); they train over it, and rank 0 says first what was bound.
TEST(MultiNode, IfaceBindsEachNodesGlooToItsVethAndRankZeroSaysSo) {
  if (const std::string why = testing::namespaces_unavailable(); !why.empty()) GTEST_SKIP() << why;
  testing::NamespacePair ns;
  if (!ns.error().empty()) GTEST_SKIP() << "cannot create network namespaces here: " << ns.error();
  TempDir dir;
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int n = 0; n < 2; ++n) {
    std::vector<std::string> argv = ns.exec(n);
    argv.insert(argv.end(), {LOCKSTEP_CLI, "run", "--nnodes", "2", "--node-rank", std::to_string(n), "--master-addr",
                             testing::NamespacePair::kAddresses[0], "--master-port", "29500", "--rdzv-timeout", "20",
                             "--iface", ns.device(n), "--", LOCKSTEP_CLI, "train", "--model", "mlp", "--data",
                             "synthetic", "--limit", "64", "--batch-size", "16", "--epochs", "1", "--quiet",
                             "--timeout", "20"});
    nodes.push_back(std::make_unique<ChildProcess>(argv, dir / ("node" + std::to_string(n) + ".out")));
  }
  std::vector<std::string> out(2);
  for (int n = 0; n < 2; ++n) {
    const std::optional<int> code = nodes[n]->wait_for(seconds(60));
    out[n] = testing::read_text(dir / ("node" + std::to_string(n) + ".out"));
    ASSERT_EQ(code.value_or(-1), 0) << "node " << n << ":\n" << out[n];
  }
  EXPECT_THAT(out[0], HasSubstr("process group: rank 0 of 2; store " + std::string(testing::NamespacePair::kAddresses[0]) +
                                ":29500 (env"));
  EXPECT_THAT(out[0], HasSubstr("iface=" + ns.device(0) + ", "));
  EXPECT_THAT(out[0], HasSubstr("addr=[" + std::string(testing::NamespacePair::kAddresses[0]) + "]"));
  EXPECT_THAT(out[1], Not(HasSubstr("process group:")));  // rank 0 alone says it
}

// Node 1's launcher is SIGKILLed mid-run (its workers die with it); node 0's workers would wait in
// their next collective until its timeout. Node 0 must stop them within --heartbeat-timeout + 5 s.
// See Note [Launcher heartbeats].
void node_killed_mid_run(const std::vector<std::vector<std::string>>& prefixes, const std::string& master,
                         const std::vector<std::vector<std::string>>& env) {
  TempDir dir;
  const int port = master == "127.0.0.1" ? testing::free_port_pair() : 29500;
  ASSERT_NE(port, 0);
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int n = 0; n < 2; ++n) {
    std::vector<std::string> argv = prefixes[n];
    argv.insert(argv.end(), {LOCKSTEP_CLI, "run", "--nnodes", "2", "--node-rank", std::to_string(n), "--master-addr",
                             master, "--master-port", std::to_string(port), "--rdzv-timeout", "20",
                             "--heartbeat-timeout", "2", "--grace-period", "1", "--", "sh", "-c",
                             "echo $$ > " + dir.path() + "/pid.$RANK; exec sleep 60"});
    nodes.push_back(std::make_unique<ChildProcess>(argv, dir / ("node" + std::to_string(n) + ".out"), env[n]));
  }
  auto worker_pid = [&](int rank) {
    const std::string text = testing::read_text(dir / ("pid." + std::to_string(rank)));
    return text.empty() ? pid_t{0} : static_cast<pid_t>(std::stol(text));
  };
  ASSERT_TRUE(testing::wait_until([&] { return worker_pid(0) != 0 && worker_pid(1) != 0; }, seconds(20)))
      << testing::read_text(dir / "node0.out") << testing::read_text(dir / "node1.out");
  const pid_t survivor = worker_pid(0);
  ASSERT_EQ(::kill(nodes[1]->pid(), SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  const std::optional<int> code = nodes[0]->wait_for(seconds(2 + 5));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  const std::string out = testing::read_text(dir / "node0.out");
  ASSERT_TRUE(code.has_value()) << "node 0 still runs " << took << " s after node 1's launcher died\n" << out;
  EXPECT_EQ(*code, 1) << out;
  EXPECT_GE(took, 1.5) << out;  // not before the heartbeat timeout
  EXPECT_THAT(out, HasSubstr("node 1's launcher sent no heartbeat for 2 s (--heartbeat-timeout): it was killed, "
                             "hangs or is cut off; stopping 1 local worker"));
  EXPECT_THAT(out, HasSubstr("lockstep run: failed: node 1's launcher sent no heartbeat"));
  EXPECT_TRUE(testing::wait_until([&] { return !testing::process_alive(survivor); }, seconds(2)));
}

TEST(MultiNode, NodeWhoseLauncherIsKilledIsDeclaredFailedByHeartbeat) {
  node_killed_mid_run({{}, {}}, "127.0.0.1", {{}, {}});
}

TEST(MultiNode, HeartbeatAcrossTwoNetworkNamespaces) {
  if (const std::string why = testing::namespaces_unavailable(); !why.empty()) GTEST_SKIP() << why;
  testing::NamespacePair ns;
  if (!ns.error().empty()) GTEST_SKIP() << "cannot create network namespaces here: " << ns.error();
  node_killed_mid_run({ns.exec(0), ns.exec(1)}, testing::NamespacePair::kAddresses[0], {{}, {}});
}

}  // namespace
}  // namespace lockstep
