#include "lockstep/data/distributed_sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../test_util.h"

namespace lockstep::data {
namespace {

std::vector<int64_t> to_vector(const torch::Tensor& t) {
  return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()};
}

std::vector<std::vector<int64_t>> all_ranks(int64_t n, int64_t world, uint64_t seed, int64_t epoch,
                                            bool drop_last) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < world; ++r) {
    DistributedSampler s(n, DistributedSamplerOptions().num_replicas(world).rank(r).seed(seed).drop_last(drop_last));
    s.set_epoch(epoch);
    out.push_back(to_vector(s.indices()));
  }
  return out;
}

// Expected values printed by Python: list(DistributedSampler(range(n), num_replicas=w, rank=r,
// shuffle=True, seed=seed, drop_last=dl)) after set_epoch(epoch), torch 1.13.1.
TEST(DistributedSampler, ProducesPyTorchIndices) {
  using V = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(all_ranks(10, 3, 5, 2, false), (V{{5, 4, 9, 2}, {0, 1, 6, 5}, {3, 7, 8, 0}}));
  EXPECT_EQ(all_ranks(10, 3, 5, 2, true), (V{{5, 4, 9}, {0, 1, 6}, {3, 7, 8}}));
  EXPECT_EQ(all_ranks(7, 2, 0, 0, false), (V{{4, 5, 2, 1}, {0, 3, 6, 4}}));
  EXPECT_EQ(all_ranks(3, 5, 1, 1, false), (V{{0}, {2}, {1}, {0}, {2}}));  // padding repeats
}

TEST(DistributedSampler, PartitionsEveryIndexExactlyOnceWhenSizeDivides) {
  auto ranks = all_ranks(60, 4, 3, 1, false);
  std::vector<int64_t> seen;
  for (const auto& r : ranks) {
    EXPECT_EQ(r.size(), 15u);
    seen.insert(seen.end(), r.begin(), r.end());
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int64_t> expected(60);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(seen, expected);
}

TEST(DistributedSampler, ShuffleChangesWithEpochAndNotWithoutIt) {
  EXPECT_NE(all_ranks(100, 1, 0, 0, false), all_ranks(100, 1, 0, 1, false));
  EXPECT_EQ(all_ranks(100, 1, 0, 1, false), all_ranks(100, 1, 0, 1, false));
  DistributedSampler ordered(5, DistributedSamplerOptions().shuffle(false).num_replicas(2).rank(1));
  EXPECT_EQ(to_vector(ordered.indices()), (std::vector<int64_t>{1, 3, 0}));
}

// One process with batch 2B visits, step by step, exactly the samples two ranks with batch B do.
TEST(DistributedSampler, OneRankBatchTwoBEqualsTwoRanksBatchB) {
  const int64_t b = 4;
  auto one = all_ranks(40, 1, 9, 3, false)[0];
  auto two = all_ranks(40, 2, 9, 3, false);
  for (int64_t step = 0; step < 5; ++step) {
    std::vector<int64_t> big(one.begin() + step * 2 * b, one.begin() + (step + 1) * 2 * b);
    std::vector<int64_t> pair(two[0].begin() + step * b, two[0].begin() + (step + 1) * b);
    pair.insert(pair.end(), two[1].begin() + step * b, two[1].begin() + (step + 1) * b);
    std::sort(big.begin(), big.end());
    std::sort(pair.begin(), pair.end());
    EXPECT_EQ(big, pair) << "step " << step;
  }
}

TEST(DistributedSampler, RejectsRankOutsideWorld) {
  std::string msg = testing::error_message(
      [] { DistributedSampler(10, DistributedSamplerOptions().num_replicas(2).rank(2)); });
  EXPECT_THAT(msg, ::testing::HasSubstr("rank=2"));
  EXPECT_THAT(msg, ::testing::HasSubstr("num_replicas=2"));
}

}  // namespace
}  // namespace lockstep::data
