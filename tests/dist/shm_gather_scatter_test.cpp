// ZeRO's and FSDP's collectives through shared memory (shm_gather_scatter.cpp, Note [Collectives
// through shared memory]) on real ranks (threads, each with its own process group): all_gather_into
// and reduce_scatter against Gloo's on the same ranks, for sizes of one element to several rounds
// of a slot, even and uneven parts, their order among queued collectives, and a mismatched
// collective named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <numeric>

#include "../../src/dist/shm_segment.h"
#include "../test_util.h"
#include "multi_rank.h"
#include "shm_and_gloo.h"

namespace lockstep::dist {
namespace {

using ::testing::HasSubstr;
using shm_testing::rank_input;
using shm_testing::run_shm_and_gloo;

const int64_t kSlotFloats = ShmSegment::kSlotBytes / 4;

// Every rank's bytes in rank order, as Gloo's all-gather gives them, in any dtype (it moves bytes):
// one element, an odd count, and more than two slots of fp32 (three rounds).
TEST(ShmAllGather, EveryRanksPartInRankOrderAsGlooGivesIt) {
  for (const int64_t world : {2, 3}) {
    run_shm_and_gloo(world, [world](int64_t rank, ProcessGroup& shm, ProcessGroup& gloo) {
      ASSERT_TRUE(shm.uses_shared_memory());
      for (const int64_t numel : {int64_t{1}, int64_t{1001}, 2 * kSlotFloats + 5}) {
        for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kLong}) {
          const torch::Tensor mine = rank_input(rank, numel, torch::kDouble).mul(1000).to(dtype);
          torch::Tensor a = torch::empty({world * numel}, mine.options()), b = torch::empty_like(a);
          shm.all_gather_into(a, mine);
          gloo.all_gather_into(b, mine);
          std::vector<torch::Tensor> parts;
          for (int64_t r = 0; r < world; ++r) parts.push_back(rank_input(r, numel, torch::kDouble).mul(1000).to(dtype));
          const std::string what = c10::str("world ", world, " rank ", rank, " numel ", numel, " ", dtype);
          EXPECT_TRUE(torch::equal(a, torch::cat(parts))) << what;
          EXPECT_TRUE(torch::equal(a, b)) << what;
        }
      }
    });
  }
}

// Each rank's part of the rank-order sum, exactly; equal to Gloo's (the all-to-all, then a sum of
// the rows) on two ranks bit for bit and on three within 1e-6. Even parts, uneven ones with an
// empty part, parts longer than a round (a slot holds N segments of a round), means of fp32 and
// fp64, and bf16 summed in fp32 and rounded once.
TEST(ShmReduceScatter, EachRankGetsItsPartOfTheSumAsGlooGivesIt) {
  for (const int64_t world : {2, 3}) {
    const std::vector<std::vector<int64_t>> layouts = {
        std::vector<int64_t>(world, 1), std::vector<int64_t>(world, 1000), std::vector<int64_t>(world, kSlotFloats),
        world == 2 ? std::vector<int64_t>{kSlotFloats + 3, 0} : std::vector<int64_t>{5, 0, kSlotFloats / 2 + 1}};
    run_shm_and_gloo(world, [&](int64_t rank, ProcessGroup& shm, ProcessGroup& gloo) {
      for (const auto& counts : layouts) {
        const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
        const int64_t start = std::accumulate(counts.begin(), counts.begin() + rank, int64_t{0});
        for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
          for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
            if (dtype == torch::kBFloat16 && op == ReduceOp::kMean) continue;  // Gloo's path only
            const torch::Tensor input = rank_input(rank, total, dtype);
            torch::Tensor a = torch::empty({counts[rank]}, input.options()), b = torch::empty_like(a);
            shm.reduce_scatter(a, input, counts, op);
            gloo.reduce_scatter(b, input, counts, op);
            const std::string what = c10::str("world ", world, " rank ", rank, " counts ", c10::Join(",", counts), " ",
                                              dtype, op == ReduceOp::kSum ? " sum" : " mean");
            torch::Tensor wide = rank_input(0, total, dtype).narrow(0, start, counts[rank]).to(torch::kFloat);
            for (int64_t r = 1; r < world; ++r)
              wide = wide + rank_input(r, total, dtype).narrow(0, start, counts[rank]).to(torch::kFloat);
            if (dtype != torch::kBFloat16) {  // the rank-order sum in the dtype itself
              torch::Tensor exact = rank_input(0, total, dtype).narrow(0, start, counts[rank]);
              for (int64_t r = 1; r < world; ++r) exact = exact + rank_input(r, total, dtype).narrow(0, start, counts[rank]);
              if (op == ReduceOp::kMean) exact = exact / world;
              EXPECT_TRUE(torch::equal(a, exact)) << what;
            } else {
              EXPECT_TRUE(torch::equal(a, wide.to(dtype))) << what;
            }
            if (op == ReduceOp::kSum) {  // started, then waited for: the same parts on both paths
              torch::Tensor c = torch::empty_like(a), d = torch::empty_like(a);
              const auto on_shm = shm.reduce_scatter_async(c, input, counts);
              const auto on_gloo = gloo.reduce_scatter_async(d, input, counts);
              shm.wait(on_shm, "reduce_scatter");
              gloo.wait(on_gloo, "reduce_scatter");
              EXPECT_TRUE(torch::equal(c, a)) << what << " async";
              EXPECT_TRUE(torch::equal(d, b)) << what << " async";
            }
            if (world == 2) {
              EXPECT_TRUE(torch::equal(a, b)) << what;
            } else {
              EXPECT_TRUE(torch::allclose(a.to(torch::kFloat), b.to(torch::kFloat), 1e-6, 1e-6)) << what;
            }
          }
        }
      }
    });
  }
}

// Note [Collectives on the calling thread]: a synchronous collective issued while queued ones are
// still pending waits its turn instead of running at once, on every rank in the same order. Rank 1
// issues its queued work later than rank 0, so on one rank the synchronous calls find the worker
// busy and on the other idle; every result is still each collective's own. Then a prefetch-style
// all_gather_into_async and a ZeRO-2-style reduce_scatter_async left running while synchronous
// calls follow them.
TEST(ShmAllGather, QueuedAndCallingThreadCollectivesKeepTheirOrder) {
  lockstep::testing::run_ranks(2, [&](int64_t rank, ProcessGroup& pg) {
    ASSERT_TRUE(pg.uses_shared_memory());
    for (int round = 0; round < 4; ++round) {
      torch::Tensor big = torch::full({3 * kSlotFloats}, static_cast<double>(rank + 1));  // three chunks
      c10::intrusive_ptr<c10d::Work> summing = pg.all_reduce_async(big);
      if (rank == 1 && round % 2 == 0) pg.wait(summing, "all_reduce");  // rank 1's worker idle by now
      torch::Tensor gathered = torch::empty({2 * 5});
      pg.all_gather_into(gathered, torch::full({5}, static_cast<double>(10 * (rank + 1) + round)));
      torch::Tensor part = torch::empty({3});
      pg.reduce_scatter(part, torch::arange(6, torch::kFloat).add(rank));
      torch::Tensor later = torch::empty({2 * 7});
      c10::intrusive_ptr<c10d::Work> prefetch = pg.all_gather_into_async(later, torch::full({7}, 1.0 + rank));
      torch::Tensor uneven = torch::empty({rank == 0 ? 4 : 2});  // a ZeRO-2 bucket's parts, left running
      c10::intrusive_ptr<c10d::Work> bucket =
          pg.reduce_scatter_async(uneven, torch::arange(6, torch::kFloat).mul(rank + 1), {4, 2});
      torch::Tensor one = torch::full({1}, 1.0);
      pg.all_reduce(one);
      pg.wait(summing, "all_reduce");
      pg.wait(prefetch, "all_gather_into");
      pg.wait(bucket, "reduce_scatter");
      EXPECT_TRUE(torch::equal(uneven, torch::arange(6, torch::kFloat).mul(3).narrow(0, rank == 0 ? 0 : 4, rank == 0 ? 4 : 2)));
      const std::string what = c10::str("rank ", rank, " round ", round);
      EXPECT_TRUE(torch::equal(big, torch::full({3 * kSlotFloats}, 3.0))) << what;
      EXPECT_TRUE(torch::equal(gathered, torch::cat({torch::full({5}, 10.0 + round), torch::full({5}, 20.0 + round)})))
          << what;
      EXPECT_TRUE(torch::equal(part, torch::arange(6, torch::kFloat).mul(2).add(1).narrow(0, 3 * rank, 3))) << what;
      EXPECT_TRUE(torch::equal(later, torch::cat({torch::full({7}, 1.0), torch::full({7}, 2.0)}))) << what;
      EXPECT_EQ(one.item<float>(), 2.0f) << what;
    }
  }, std::chrono::seconds(20));
}

// One rank in an all-gather while the other is in a reduce-scatter: both name what each is in.
TEST(ShmReduceScatter, AMismatchedCollectiveIsNamedOnEveryRank) {
  std::vector<std::string> messages(2);
  lockstep::testing::run_ranks(2, [&](int64_t rank, ProcessGroup& pg) {
    messages[rank] = lockstep::testing::error_message([&] {
      torch::Tensor out = torch::empty({rank == 0 ? 8 : 4});
      if (rank == 0) {
        pg.all_gather_into(out, torch::ones({4}));
      } else {
        pg.reduce_scatter(out, torch::ones({8}));
      }
    });
  }, std::chrono::seconds(5));
  EXPECT_THAT(messages[0], HasSubstr("this rank is in an all-gather of 4 Float elements but rank 1 is in a "
                                     "reduce-scatter of 8 Float elements"));
  EXPECT_THAT(messages[1], HasSubstr("this rank is in a reduce-scatter of 8 Float elements but rank 0 is in an "
                                     "all-gather of 4 Float elements"));
}

}  // namespace
}  // namespace lockstep::dist
