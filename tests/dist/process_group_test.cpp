#include "lockstep/dist/process_group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <future>
#include <mutex>

#include "../test_util.h"
#include "multi_rank.h"

namespace lockstep::dist {
namespace {

using ::testing::HasSubstr;
using lockstep::testing::run_ranks;

TEST(ProcessGroup, CollectivesOnThreeRanks) {
  run_ranks(3, [](int64_t rank, ProcessGroup& pg) {
    EXPECT_EQ(pg.rank(), rank);
    EXPECT_EQ(pg.size(), 3);
    torch::Tensor sum = torch::full({4}, static_cast<float>(rank + 1));
    pg.all_reduce(sum);
    EXPECT_TRUE(torch::allclose(sum, torch::full({4}, 6.0f)));
    torch::Tensor mean = torch::full({2}, static_cast<float>(rank));
    pg.all_reduce(mean, ReduceOp::kMean);
    EXPECT_TRUE(torch::allclose(mean, torch::full({2}, 1.0f)));
    torch::Tensor max = torch::tensor({static_cast<float>(rank), -static_cast<float>(rank)});
    pg.all_reduce(max, ReduceOp::kMax);
    EXPECT_TRUE(torch::equal(max, torch::tensor({2.0f, 0.0f})));
    torch::Tensor b = rank == 1 ? torch::arange(5, torch::kFloat) : torch::zeros({5});
    pg.broadcast(b, /*root=*/1);
    EXPECT_TRUE(torch::equal(b, torch::arange(5, torch::kFloat)));
    auto gathered = pg.all_gather(torch::full({2}, rank * 10, torch::kInt64));
    ASSERT_EQ(gathered.size(), 3u);
    for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(gathered[r][1].item<int64_t>(), r * 10);
    EXPECT_DOUBLE_EQ(pg.average(static_cast<double>(rank) * 3.0), 3.0);
    pg.barrier();
  });
}

TEST(ProcessGroup, FileInitMethodWorks) {
  testing::TempDir dir;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto pg = init_process_group(InitOptions().init_method("file://" + (dir / "rdzv")).rank(r)
                                       .world_size(2).timeout(std::chrono::seconds(20)));
      torch::Tensor t = torch::ones({1});
      pg->all_reduce(t);
      if (t.item<float>() == 2.0f) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 2);
}

TEST(ProcessGroup, RankOutsideWorldIsRejected) {
  auto msg = testing::error_message([] { init_process_group(testing::loopback(2, 2, 1)); });
  EXPECT_THAT(msg, HasSubstr("rank 2 is not smaller than world size 2"));
}

TEST(ProcessGroup, MissingRankTimesOutSayingHowManyArrived) {
  const int port = testing::free_port();
  const auto t0 = std::chrono::steady_clock::now();
  auto msg = testing::error_message(
      [&] { init_process_group(testing::loopback(0, 3, port, std::chrono::milliseconds(1500))); });
  EXPECT_THAT(msg, HasSubstr("1 of 3 ranks arrived"));
  EXPECT_THAT(msg, HasSubstr("127.0.0.1:" + std::to_string(port)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST(ProcessGroup, SilentMasterIsNamedWithAddressAndPort) {
  const int port = testing::free_port();  // nobody listens there
  auto msg = testing::error_message(
      [&] { init_process_group(testing::loopback(1, 2, port, std::chrono::milliseconds(1500))); });
  EXPECT_THAT(msg, HasSubstr("rank 1 of 2: the master at 127.0.0.1:" + std::to_string(port)));
  EXPECT_THAT(msg, HasSubstr("never answered"));
}

TEST(ProcessGroup, PortInUseIsReported) {
  const int port = testing::free_port();
  std::unique_ptr<ProcessGroup> first;
  std::thread peer([&] { first = init_process_group(testing::loopback(0, 1, port)); });
  peer.join();
  auto msg = testing::error_message(
      [&] { init_process_group(testing::loopback(0, 2, port, std::chrono::milliseconds(1500))); });
  EXPECT_THAT(msg, HasSubstr("port may be in use"));
}

// See Note [Naming the rank that did not arrive]: rank 2 stays alive but never joins the
// all-reduce; both ranks that waited for it name it, and only it.
TEST(ProcessGroup, ACollectiveTimeoutNamesTheRankThatDidNotArrive) {
  std::promise<void> reported;
  std::shared_future<void> done = reported.get_future().share();
  std::atomic<int> waiting{2};
  std::vector<std::string> messages(3);
  run_ranks(
      3,
      [&](int64_t rank, ProcessGroup& pg) {
        if (rank == 2) {
          ASSERT_EQ(done.wait_for(std::chrono::seconds(30)), std::future_status::ready);
          return;
        }
        torch::Tensor t = torch::ones({4});
        messages[rank] = testing::error_message([&] { pg.all_reduce(t); });
        if (--waiting == 0) reported.set_value();
      },
      std::chrono::milliseconds(1000));
  for (int64_t rank : {0, 1}) {
    EXPECT_THAT(messages[rank], HasSubstr("all_reduce failed on rank " + std::to_string(rank) + " of 3 (timeout 1 s)"));
    EXPECT_THAT(messages[rank], HasSubstr("Rank 2 did not sign in within 1 s of the failure: it stalled"));
    EXPECT_THAT(messages[rank], HasSubstr("lockstep train --timeout"));
  }
}

}  // namespace
}  // namespace lockstep::dist
