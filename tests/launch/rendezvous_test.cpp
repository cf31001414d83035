#include "lockstep/launch/rendezvous.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <future>

#include "../test_util.h"
#include "lockstep/core/tcp_store.h"

namespace lockstep::launch {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;
using std::chrono::seconds;

RendezvousOptions node(int64_t rank, int64_t nnodes, int port, milliseconds timeout = seconds(10),
                       JobIdentity job = JobIdentity({"train"}, {})) {
  return RendezvousOptions().nnodes(nnodes).node_rank(rank).master_port(port).timeout(timeout).job(std::move(job));
}

// Accepts TCP connections on 127.0.0.1:port and never answers: a foreign program on the port.
class SilentListener {
 public:
  explicit SilentListener(int port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    const int on = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ok_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && ::listen(fd_, 16) == 0;
  }
  ~SilentListener() { ::close(fd_); }
  bool ok() const { return ok_; }

 private:
  int fd_;  // the kernel completes connections in its backlog; nobody reads them
  bool ok_ = false;
};

TEST(Rendezvous, OneNodeNeedsNoStore) {
  Rendezvous r(RendezvousOptions().master_port(1));  // port 1 would fail if anything listened
  NodeAssignment a = r.join(0, 4);
  EXPECT_EQ(a.world_size, 4);
  EXPECT_EQ(a.first_rank, 0);
  EXPECT_FALSE(r.failure(0).has_value());
  EXPECT_TRUE(r.all_done(0));
}

TEST(Rendezvous, AssignsRanksInNodeRankOrderWithUnevenNodes) {
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  Rendezvous master(node(0, 3, port));
  // Nodes 2 and 1 join before node 0 does, bringing 1 and 2 workers.
  auto node2 = std::async(std::launch::async, [&] { Rendezvous r(node(2, 3, port)); return r.join(0, 1); });
  auto node1 = std::async(std::launch::async, [&] { Rendezvous r(node(1, 3, port)); return r.join(0, 2); });
  NodeAssignment a0 = master.join(0, 3);
  NodeAssignment a1 = node1.get();
  NodeAssignment a2 = node2.get();
  EXPECT_EQ(a0.world_size, 6);
  EXPECT_EQ(a1.world_size, 6);
  EXPECT_EQ(a2.world_size, 6);
  EXPECT_EQ(a0.first_rank, 0);
  EXPECT_EQ(a1.first_rank, 3);
  EXPECT_EQ(a2.first_rank, 5);
}

TEST(Rendezvous, FirstReportedFailureOfARoundReachesEveryNode) {
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  Rendezvous master(node(0, 2, port));
  Rendezvous other(node(1, 2, port));
  auto joined = std::async(std::launch::async, [&] { return other.join(0, 1); });
  master.join(0, 1);
  joined.get();
  EXPECT_FALSE(master.failure(0).has_value());
  other.report_failure(0, "rank 1 exited with code 3");
  master.report_failure(0, "rank 0 was killed by SIGTERM");
  EXPECT_EQ(master.failure(0).value_or(""), "rank 1 exited with code 3");
  EXPECT_EQ(other.failure(0).value_or(""), "rank 1 exited with code 3");
  EXPECT_FALSE(master.failure(1).has_value()) << "a new round starts clean";

  master.report_done(1);
  EXPECT_FALSE(other.all_done(1));
  other.report_done(1);
  EXPECT_TRUE(master.all_done(1));
  other.leave(1);
  master.leave(1);
}

TEST(Rendezvous, DuplicateNodeRankIsRejected) {
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  Rendezvous master(node(0, 2, port, seconds(1)));
  Rendezvous first(node(1, 2, port, seconds(1)));
  Rendezvous second(node(1, 2, port, seconds(1)));
  auto waiting = std::async(std::launch::async, [&] { return testing::error_message([&] { first.join(0, 1); }); });
  // Whichever of the two joins second is told; the other times out with node 0 missing.
  const std::string second_error = testing::error_message([&] { second.join(0, 1); });
  const std::string first_error = waiting.get();
  EXPECT_THAT(first_error + second_error, HasSubstr("two launchers were given --node-rank 1"));
}

TEST(Rendezvous, NodeThatCannotReachNodeZeroSaysWhere) {
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  const std::string error =
      testing::error_message([&] { Rendezvous r(node(1, 2, port, seconds(1))); });
  EXPECT_THAT(error, HasSubstr("could not reach node 0's launcher at 127.0.0.1:" + std::to_string(port + 1)));
}

// Issue 54 item 3: node 0 with `--lr 0.02`, node 1 with `--lr 0.90`; both trained, each with its
// own rate, because only the word count was compared.
TEST(Rendezvous, NodesWhoseCommandsDifferBothFailAtOnceNamingTheFirstDifferingArgument) {
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  const auto start = std::chrono::steady_clock::now();
  Rendezvous master(node(0, 2, port, seconds(30), JobIdentity({"train", "--lr", "0.02"}, {})));
  Rendezvous other(node(1, 2, port, seconds(30), JobIdentity({"train", "--lr", "0.90"}, {})));
  auto waiting = std::async(std::launch::async, [&] { return testing::error_message([&] { master.join(0, 1); }); });
  const std::string other_error = testing::error_message([&] { other.join(0, 1); });
  const std::string master_error = waiting.get();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  for (const std::string& error : {master_error, other_error}) {
    // Whichever node joined first is the one the other compares itself with.
    EXPECT_THAT(error, HasSubstr("nodes disagree on the job: argument 2 of the program is '0."));
    EXPECT_THAT(error, HasSubstr("'0.90' on node 1"));
    EXPECT_THAT(error, HasSubstr("'0.02' on node 0"));
    EXPECT_THAT(error, HasSubstr("give each its own --master-port"));
  }
}

// Issue 54 item 4: a second job pointed at the first's endpoint merged into its world.
TEST(Rendezvous, ANodeOfAnotherJobIsRefusedAloneAndTheJobGoesOn) {
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  Rendezvous master(node(0, 2, port, seconds(30), JobIdentity({"train"}, {}, "job-x")));
  auto joined = std::async(std::launch::async, [&] { return master.join(0, 1); });
  // Node 0 joins as soon as it hosts the store; here the foreign node must come after it has.
  auto probe = connect_tcp_store("127.0.0.1", port + 1, seconds(5), seconds(5));
  ASSERT_TRUE(testing::wait_until([&] { return probe->check({"lockstep/round0/job"}); }, seconds(5)));
  {
    Rendezvous foreign(node(1, 2, port, seconds(30), JobIdentity({"train"}, {}, "job-y")));
    const std::string error = testing::error_message([&] { foreign.join(0, 1); });
    EXPECT_THAT(error, HasSubstr("belongs to another job: its --rdzv-id is 'job-x', this node's 'job-y'"));
  }
  Rendezvous own(node(1, 2, port, seconds(30), JobIdentity({"train"}, {}, "job-x")));
  EXPECT_EQ(own.join(0, 1).world_size, 2);
  EXPECT_EQ(joined.get().world_size, 2);
}

// Issue 54 item 9: a foreign program on --master-port + 1 that accepts and never answers kept node 1
// waiting past 90 s with --rdzv-timeout 5.
TEST(Rendezvous, APortThatAcceptsButNeverAnswersFailsWithinTheTimeoutNamingIt) {
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  SilentListener silent(port + 1);
  ASSERT_TRUE(silent.ok());
  const auto start = std::chrono::steady_clock::now();
  const std::string error = testing::error_message([&] { Rendezvous r(node(1, 2, port, seconds(2))); r.join(0, 1); });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 8.0);
  EXPECT_THAT(error, HasSubstr("could not reach node 0's launcher at 127.0.0.1:" + std::to_string(port + 1)));
  EXPECT_THAT(error, HasSubstr("accepted a connection but did not answer as a c10d store within 2 s"));
}

// Issue 54 item 13: of two launchers given --node-rank 0 on one host, the second failed at once and
// the first waited the whole rendezvous timeout.
TEST(Rendezvous, TwoNodesZeroOnOneHostBothFailAtOnce) {
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  const auto start = std::chrono::steady_clock::now();
  Rendezvous first(node(0, 2, port, seconds(30)));
  auto waiting = std::async(std::launch::async, [&] { return testing::error_message([&] { first.join(0, 1); }); });
  // The second cannot host the store the first holds; it tells the first, which waits in join().
  const std::string second_error = testing::error_message([&] { Rendezvous second(node(0, 2, port, seconds(30))); });
  const std::string first_error = waiting.get();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  EXPECT_THAT(second_error, HasSubstr("two launchers were given --node-rank 0"));
  EXPECT_THAT(first_error, HasSubstr("two launchers were given --node-rank 0"));
}

}  // namespace
}  // namespace lockstep::launch
