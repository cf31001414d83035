// Note [Collectives through shared memory] on real ranks (threads of this process, each with its own
// process group, as multi_rank.h runs them): all-reduces and broadcasts against Gloo's, async
// collectives in flight beside Gloo ones, the ranks named when one does not arrive or issues another
// collective, the segment's name gone from /dev/shm.
#include "../../src/dist/shm_collectives.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

#include "../test_util.h"
#include "multi_rank.h"
#include "shm_and_gloo.h"

namespace lockstep::dist {
namespace {

using ::testing::HasSubstr;
using lockstep::testing::free_port;
using lockstep::testing::loopback;
using lockstep::testing::run_ranks;
using shm_testing::rank_input;
using shm_testing::run_shm_and_gloo;

// ((x0 + x1) + x2) ...: the ranks' inputs summed in rank order, in `dtype`.
torch::Tensor sum_in_rank_order(int64_t world, int64_t numel, torch::ScalarType dtype) {
  torch::Tensor sum = rank_input(0, numel, dtype);
  for (int64_t r = 1; r < world; ++r) sum = sum + rank_input(r, numel, dtype);
  return sum;
}

const int64_t kSlotFloats = ShmSegment::kSlotBytes / 4;

// Sizes: empty, one element, counts that are not multiples of the ranks, and more than two slots
// (three chunks). Two ranks: Gloo's a + b bit for bit. Three: Gloo's ring adds in another
// order, so within 1e-6 (rtol and atol; the sums are of order 1), and shared memory's own sum is
// exactly the rank-order sum.
TEST(ShmAllReduce, SumsAndMeansEqualGlooOnTwoAndThreeRanks) {
  for (const int64_t world : {2, 3}) {
    run_shm_and_gloo(world, [world](int64_t rank, ProcessGroup& shm, ProcessGroup& gloo) {
      ASSERT_TRUE(shm.uses_shared_memory());
      ASSERT_FALSE(gloo.uses_shared_memory());
      for (const int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, 2 * kSlotFloats + 5}) {
        for (const auto dtype : {torch::kFloat, torch::kDouble}) {
          for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
            torch::Tensor a = rank_input(rank, numel, dtype), b = a.clone();
            shm.all_reduce(a, op);
            gloo.all_reduce(b, op);
            const std::string what = c10::str("world ", world, " rank ", rank, " numel ", numel, " ", dtype,
                                              op == ReduceOp::kSum ? " sum" : " mean");
            if (world == 2) {
              EXPECT_TRUE(torch::equal(a, b)) << what;
            } else {
              EXPECT_TRUE(torch::allclose(a, b, 1e-6, 1e-6)) << what;
            }
            if (op == ReduceOp::kSum) EXPECT_TRUE(torch::equal(a, sum_in_rank_order(world, numel, dtype))) << what;
          }
        }
      }
    });
  }
}

// fp16 and bf16 (Gloo cannot add bf16 at all) are summed in fp32 and rounded once: exactly the
// rounded fp32 sum of the 16-bit inputs, and within 16-bit rounding of the sum of the fp32 originals.
TEST(ShmAllReduce, SixteenBitFloatsAreSummedInFp32AndRoundedOnce) {
  run_ranks(3, [](int64_t rank, ProcessGroup& pg) {
    for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
      torch::Tensor t = rank_input(rank, 1001, dtype);
      pg.all_reduce(t);
      const torch::Tensor fp32_sum = sum_in_rank_order(3, 1001, torch::kFloat);
      torch::Tensor exact = rank_input(0, 1001, dtype).to(torch::kFloat);
      for (int64_t r = 1; r < 3; ++r) exact = exact + rank_input(r, 1001, dtype).to(torch::kFloat);
      EXPECT_TRUE(torch::equal(t, exact.to(dtype))) << dtype;
      EXPECT_TRUE(torch::allclose(t.to(torch::kFloat), fp32_sum, 1.0 / 64, 0.05)) << dtype;
    }
  });
}

// DDP's pattern: several all_reduce_async in flight at once, with a broadcast (through shared
// memory too, queued behind them) and a Gloo collective (an all-gather) of the same group issued
// between them; waited in order, each holds its own sum.
TEST(ShmAllReduce, AsyncAllReducesInFlightBesideBroadcastsAndGlooCollectives) {
  run_ranks(2, [](int64_t rank, ProcessGroup& pg) {
    ASSERT_TRUE(pg.uses_shared_memory());
    const std::vector<int64_t> sizes{3, kSlotFloats + 1, 1000, 1, 0};
    std::vector<torch::Tensor> tensors;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (size_t i = 0; i < sizes.size(); ++i) {
      tensors.push_back(rank_input(10 * rank + static_cast<int64_t>(i), sizes[i]));
      works.push_back(pg.all_reduce_async(tensors.back()));
      torch::Tensor b = rank == 0 ? torch::arange(5, torch::kFloat) + static_cast<float>(i) : torch::zeros({5});
      pg.broadcast(b, 0);
      EXPECT_TRUE(torch::equal(b, torch::arange(5, torch::kFloat) + static_cast<float>(i))) << i;
      const auto gathered = pg.all_gather(torch::full({2}, static_cast<int64_t>(10 * i) + rank, torch::kLong));
      EXPECT_TRUE(torch::equal(gathered[1] - gathered[0], torch::ones({2}, torch::kLong))) << i;
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      pg.wait(works[i], "an all-reduce in flight");
      EXPECT_TRUE(works[i]->isCompleted());
      const auto n = static_cast<int64_t>(i);
      EXPECT_TRUE(torch::equal(tensors[i], rank_input(n, sizes[i]) + rank_input(10 + n, sizes[i]))) << i;
    }
    EXPECT_DOUBLE_EQ(pg.average(static_cast<double>(rank)), 0.5);
  });
}

// Rank 2 stays alive but skips all-reduce #2: ranks 0 and 1 fail within the timeout, naming rank 2,
// the step, themselves and the collective's number; rank 2 waits for their verdicts, not for a time.
TEST(ShmAllReduce, ARankThatNeverArrivesIsNamedWithinTheTimeout) {
  std::promise<void> reported;
  std::shared_future<void> done = reported.get_future().share();
  std::atomic<int> waiting{2};
  std::vector<std::string> messages(3);
  const auto t0 = std::chrono::steady_clock::now();
  run_ranks(
      3,
      [&](int64_t rank, ProcessGroup& pg) {
        ASSERT_TRUE(pg.uses_shared_memory());
        torch::Tensor t = torch::ones({4});
        pg.all_reduce(t);
        if (rank == 2) {
          ASSERT_EQ(done.wait_for(std::chrono::seconds(30)), std::future_status::ready);
          return;
        }
        messages[rank] = testing::error_message([&] { pg.all_reduce(t); });
        if (--waiting == 0) reported.set_value();
      },
      std::chrono::milliseconds(1500));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
  for (int64_t rank : {0, 1}) {
    const std::string& msg = messages[rank];
    EXPECT_THAT(msg, HasSubstr("all_reduce failed on rank " + std::to_string(rank) + " of 3 (timeout 1.5 s)"));
    EXPECT_THAT(msg, HasSubstr("shared-memory all-reduce #2 (4 Float elements, chunk 1 of 1) on rank " +
                               std::to_string(rank) + " of 3: rank 2 did not arrive with its input"));
    EXPECT_THAT(msg, HasSubstr("rank 2 was last in #1"));
    EXPECT_THAT(msg, HasSubstr("Rank 2 did not sign in"));
  }
}

// A rank whose group is destroyed (its thread or process is leaving) marks the segment: the other
// fails at once, naming it, instead of waiting out a 20 s timeout.
TEST(ShmAllReduce, ARankThatLeavesFailsTheOthersAtOnce) {
  std::string message;
  const auto t0 = std::chrono::steady_clock::now();
  run_ranks(2, [&](int64_t rank, ProcessGroup& pg) {
    if (rank == 1) return;  // destroys its group
    torch::Tensor t = torch::ones({4});
    message = testing::error_message([&] { pg.all_reduce(t); });
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(12));  // the roll call takes 5 s
  EXPECT_THAT(message, HasSubstr("rank 1 did not arrive with its input before rank 1 gave up on the group's "
                                 "shared memory"));
}

// Shapes are compared before anything is summed: both ranks name both sizes.
TEST(ShmAllReduce, DifferentSizesOnTwoRanksAreNamed) {
  std::vector<std::string> messages(2);
  run_ranks(2, [&](int64_t rank, ProcessGroup& pg) {
    torch::Tensor t = torch::ones({4 + rank});
    messages[rank] = testing::error_message([&] { pg.all_reduce(t); });
  }, std::chrono::seconds(5));
  EXPECT_THAT(messages[0], HasSubstr("this rank is in an all-reduce of 4 Float elements but rank 1 is in an "
                                     "all-reduce of 5 Float elements"));
  EXPECT_THAT(messages[1], HasSubstr("this rank is in an all-reduce of 5 Float elements but rank 0 is in an "
                                     "all-reduce of 4 Float"));
  EXPECT_THAT(messages[0], HasSubstr("every rank must issue the same collectives, of tensors of the same size and dtype"));
}

// Rank `root`'s bytes, whatever the dtype (BN buffers mix floats with an int64 counter; bf16 is
// one Gloo cannot add): every rank ends with them exactly, as Gloo's broadcast gives, for every
// root of three ranks and sizes from empty to more than two slots.
TEST(ShmBroadcast, EveryRankGetsTheRootsBytesInEveryDtypeAndSize) {
  run_shm_and_gloo(3, [](int64_t rank, ProcessGroup& shm, ProcessGroup& gloo) {
    for (const auto dtype : {torch::kUInt8, torch::kLong, torch::kFloat, torch::kBFloat16}) {
      const int64_t slot = ShmSegment::kSlotBytes / static_cast<int64_t>(c10::elementSize(dtype));
      for (const int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, 2 * slot + 3}) {
        for (int64_t root = 0; root < 3; ++root) {
          const auto input = [&](int64_t r) { return (rank_input(r, numel).abs() * 100).to(dtype); };
          torch::Tensor a = input(rank), b = input(rank);
          shm.broadcast(a, root);
          gloo.broadcast(b, root);
          const std::string what = c10::str("rank ", rank, " root ", root, " numel ", numel, " ", dtype);
          EXPECT_TRUE(torch::equal(a, input(root))) << what;
          EXPECT_TRUE(torch::equal(a, b)) << what;
        }
      }
    }
  });
}

// A broadcast where another rank all-reduces, or broadcasts from another root, is named on both
// ranks before any byte is copied.
TEST(ShmBroadcast, AMismatchedCollectiveOrRootIsNamed) {
  std::vector<std::string> messages(2);
  run_ranks(2, [&](int64_t rank, ProcessGroup& pg) {
    torch::Tensor t = torch::ones({4});
    messages[rank] = testing::error_message([&] { rank == 0 ? pg.broadcast(t, 0) : pg.all_reduce(t); });
  }, std::chrono::seconds(5));
  EXPECT_THAT(messages[0], HasSubstr("shared-memory broadcast #1 on rank 0 of 2: this rank is in a broadcast from "
                                     "rank 0 of 4 Float elements but rank 1 is in an all-reduce of 4 Float elements"));
  EXPECT_THAT(messages[1], HasSubstr("this rank is in an all-reduce of 4 Float elements but rank 0 is in a broadcast"));
  run_ranks(2, [&](int64_t rank, ProcessGroup& pg) {
    torch::Tensor t = torch::ones({4});
    messages[rank] = testing::error_message([&] { pg.broadcast(t, rank); });
  }, std::chrono::seconds(5));
  EXPECT_THAT(messages[1], HasSubstr("a broadcast from rank 1 of 4 Float elements but rank 0 is in a broadcast from "
                                     "rank 0"));
}

std::vector<std::string> our_segments_in(const std::string& listing) {
  const std::string prefix = "lockstep-" + std::to_string(::getpid()) + "-";
  std::vector<std::string> found;
  std::istringstream lines(listing);
  for (std::string line; std::getline(lines, line);)
    if (line.find(prefix) != std::string::npos) found.push_back(line);
  return found;
}

std::string dev_shm() {
  std::string names;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) names += entry.path().string() + "\n";
  return names;
}

std::string maps() {
  std::ifstream in("/proc/self/maps");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// While the group exists its segment is mapped but has no name in /dev/shm (a crash leaves nothing);
// after the group is destroyed it is not mapped either.
TEST(ShmAllReduce, TheSegmentIsUnlinkedOnceTheGroupExistsAndUnmappedWithIt) {
  run_ranks(2, [](int64_t /*rank*/, ProcessGroup& pg) {
    ASSERT_TRUE(pg.uses_shared_memory());
    EXPECT_THAT(our_segments_in(dev_shm()), ::testing::IsEmpty());
    const auto mapped = our_segments_in(maps());
    EXPECT_FALSE(mapped.empty());
    for (const auto& line : mapped) EXPECT_THAT(line, HasSubstr("(deleted)"));
    pg.barrier();  // both ranks looked before either destroys its group
  });
  EXPECT_THAT(our_segments_in(maps()), ::testing::IsEmpty());
  EXPECT_THAT(our_segments_in(dev_shm()), ::testing::IsEmpty());
}

// Off on one rank is off for all (they must agree on the transport); LOCKSTEP_SHM=0 is the same.
TEST(ShmAllReduce, OffByOptionOnAnyRankOrByTheEnvironment) {
  const int port = free_port();
  std::vector<std::thread> threads;
  std::vector<int> used(2, -1), sums(2, -1);
  for (int64_t r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto pg = init_process_group(loopback(r, 2, port).shared_memory(r == 1 ? SharedMemory::kOff : SharedMemory::kAuto));
      used[r] = pg->uses_shared_memory();
      torch::Tensor t = torch::ones({3});
      pg->all_reduce(t);
      sums[r] = static_cast<int>(t[0].item<float>());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(used, (std::vector<int>{0, 0}));
  EXPECT_EQ(sums, (std::vector<int>{2, 2}));

  ::setenv("LOCKSTEP_SHM", "0", 1);
  run_ranks(2, [](int64_t, ProcessGroup& pg) { EXPECT_FALSE(pg.uses_shared_memory()); });
  ::unsetenv("LOCKSTEP_SHM");
  run_ranks(2, [](int64_t, ProcessGroup& pg) { EXPECT_TRUE(pg.uses_shared_memory()); });
}

// See Note [Subgroups]: a subgroup of two or more ranks gets its own segment; one of one rank has
// nothing to share.
TEST(ShmAllReduce, SubgroupsGetTheirOwnSegment) {
  run_ranks(3, [](int64_t rank, ProcessGroup& pg) {
    auto pair = pg.new_group({0, 2});
    auto single = pg.new_group({1});
    if (rank == 1) {
      ASSERT_NE(single, nullptr);
      EXPECT_FALSE(single->uses_shared_memory());
      return;
    }
    ASSERT_NE(pair, nullptr);
    EXPECT_TRUE(pair->uses_shared_memory());
    torch::Tensor t = torch::full({kSlotFloats + 3}, static_cast<float>(rank));
    pair->all_reduce(t);
    EXPECT_TRUE(torch::equal(t, torch::full({kSlotFloats + 3}, 2.0f)));
  });
}

}  // namespace
}  // namespace lockstep::dist
