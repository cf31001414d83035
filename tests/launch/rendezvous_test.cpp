#include "lockstep/launch/rendezvous.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>

#include "../test_util.h"

namespace lockstep::launch {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;
using std::chrono::seconds;

RendezvousOptions node(int64_t rank, int64_t nnodes, int port, milliseconds timeout = seconds(10)) {
  return RendezvousOptions().nnodes(nnodes).node_rank(rank).master_port(port).timeout(timeout);
}

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

}  // namespace
}  // namespace lockstep::launch
