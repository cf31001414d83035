#include "lockstep/data/bucket_batch_sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <cmath>
#include <map>
#include <random>

#include "../test_util.h"
#include "lockstep/data/distributed_sampler.h"
#include "lockstep/data/text_corpus.h"
#include "lockstep/data/tokenizer_trainer.h"

namespace lockstep::data {
namespace {

using ::testing::HasSubstr;

// Lengths drawn like text: mostly short, a long tail, a few over max_length and a few empty.
std::vector<int64_t> text_like_lengths(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::lognormal_distribution<double> dist(3.5, 1.0);
  std::vector<int64_t> lengths(n);
  for (auto& l : lengths) l = static_cast<int64_t>(dist(gen));
  return lengths;
}

std::vector<std::vector<Batch>> every_rank(const std::vector<int64_t>& lengths, BucketBatchSamplerOptions o, int64_t epoch) {
  std::vector<std::vector<Batch>> out;
  for (int64_t r = 0; r < o.num_replicas(); ++r) {
    BucketBatchSampler s(lengths, o.rank(r));
    s.set_epoch(epoch);
    out.push_back(s.batches());
  }
  return out;
}

TEST(BucketBatchSampler, VisitsEveryKeptEntryOncePerEpochOnTheRanksTogether) {
  const auto lengths = text_like_lengths(3000, 1);
  for (const auto policy : {OverlengthPolicy::kTruncate, OverlengthPolicy::kDrop}) {
    for (const int64_t world : {1, 2, 3}) {
      const auto o = BucketBatchSamplerOptions().max_tokens(2048).max_length(256).overlength(policy).sort_size(500).num_replicas(world).seed(7);
      std::map<int64_t, int> visits;
      size_t largest_batch = 0;
      for (const auto& rank : every_rank(lengths, o, 3))
        for (const Batch& b : rank) {
          largest_batch = std::max(largest_batch, b.indices.size());
          for (const int64_t i : b.indices) ++visits[i];
        }
      size_t expected_kept = 0, repeats = 0;
      for (size_t i = 0; i < lengths.size(); ++i) {
        const bool kept = lengths[i] > 0 && (policy == OverlengthPolicy::kTruncate || lengths[i] <= 256);
        expected_kept += kept;
        EXPECT_EQ(visits.count(static_cast<int64_t>(i)) > 0, kept) << "entry " << i << " of length " << lengths[i];
        if (visits.count(static_cast<int64_t>(i))) repeats += visits[static_cast<int64_t>(i)] - 1;
      }
      EXPECT_EQ(visits.size(), expected_kept);
      // Only the fewer than `world` batches repeated to even out the ranks visit entries twice.
      EXPECT_LE(repeats, static_cast<size_t>(world - 1) * largest_batch) << "world " << world;
      if (world == 1) EXPECT_EQ(repeats, 0u);
    }
  }
}

TEST(BucketBatchSampler, NoBatchExceedsTheTokenBudget) {
  const auto lengths = text_like_lengths(5000, 2);
  for (const int64_t budget : {300, 1024, 4096}) {
    BucketBatchSampler s(lengths, BucketBatchSamplerOptions().max_tokens(budget).max_length(300).seed(budget));
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      s.set_epoch(epoch);
      for (const Batch& b : s.batches()) {
        int64_t longest = 0, tokens = 0;
        for (const int64_t i : b.indices) {
          longest = std::max(longest, std::min<int64_t>(lengths[i], 300));
          tokens += std::min<int64_t>(lengths[i], 300);
        }
        EXPECT_LE(longest * static_cast<int64_t>(b.indices.size()), budget);
        EXPECT_EQ(b.length, longest);
        EXPECT_EQ(b.tokens, tokens);
      }
    }
  }
}

TEST(BucketBatchSampler, EveryRankHasTheSameNumberOfBatches) {
  const auto lengths = text_like_lengths(2500, 3);
  for (const int64_t world : {2, 3}) {
    for (const bool drop_last : {false, true}) {
      for (int64_t epoch = 0; epoch < 4; ++epoch) {
        const auto ranks = every_rank(lengths, BucketBatchSamplerOptions().max_tokens(1500).max_length(400).num_replicas(world).drop_last(drop_last).seed(11), epoch);
        for (const auto& r : ranks) EXPECT_EQ(r.size(), ranks[0].size()) << "world " << world << " epoch " << epoch;
        EXPECT_GT(ranks[0].size(), 10u);
      }
    }
  }
}

TEST(BucketBatchSampler, ResumesMidEpochWithExactlyTheSameBatches) {
  const auto lengths = text_like_lengths(2000, 4);
  const auto o = BucketBatchSamplerOptions().max_tokens(1024).max_length(256).num_replicas(2).rank(1).seed(5);
  BucketBatchSampler first(lengths, o);
  first.set_epoch(2);
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(first.next().has_value());
  const BucketBatchSampler::State saved = first.state();
  EXPECT_EQ(saved.epoch, 2);
  EXPECT_EQ(saved.next_batch, 7);
  BucketBatchSampler resumed(lengths, o);  // a fresh process after a restart
  resumed.load_state(saved);
  int remaining = 0;
  while (auto expected = first.next()) {
    const auto got = resumed.next();
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->indices, expected->indices);
    ++remaining;
  }
  EXPECT_FALSE(resumed.next().has_value());
  EXPECT_GT(remaining, 0);
  BucketBatchSampler other_epoch(lengths, o);
  other_epoch.set_epoch(3);
  EXPECT_NE(other_epoch.batches()[0].indices, first.batches()[0].indices);  // shuffled per epoch
}

TEST(BucketBatchSampler, RejectsABudgetSmallerThanOneSequence) {
  EXPECT_THAT(testing::error_message([] { BucketBatchSampler({10, 700, 20}, BucketBatchSamplerOptions().max_tokens(512).max_length(1024)); }),
              HasSubstr("max_tokens=512 is smaller than one sequence of 700 tokens (max_length=1024); raise max_tokens to at least 700"));
  EXPECT_THAT(testing::error_message([] { BucketBatchSampler({10}, BucketBatchSamplerOptions().num_replicas(2).rank(2)); }),
              HasSubstr("rank=2 must be in [0, 1]"));
  EXPECT_THAT(testing::error_message([] { BucketBatchSampler({900}, BucketBatchSamplerOptions().max_length(512).overlength(OverlengthPolicy::kDrop)); }),
              HasSubstr("none of the 1 sequences is kept"));
}

// The figures for the issue: on the fortunes corpus's token lengths (byte-level BPE, 8000 tokens),
// the share of padded tokens in bucketed batches and in fixed-size batches of the same mean size
// (DistributedSampler order, padded to the batch's longest, truncated at max_length alike).
TEST(BucketBatchSampler, PadsFarLessThanFixedSizeBatchesOnFortunes) {
  if (!std::filesystem::exists("/usr/share/games/fortunes")) GTEST_SKIP() << "fortunes not installed (scripts/bootstrap)";
  const auto corpus = read_text_corpus("/usr/share/games/fortunes", TextCorpusFormat::kFortunes);
  const Tokenizer tokenizer = train_tokenizer(corpus, TokenizerTrainerOptions().vocab_size(8000));
  std::vector<int64_t> lengths;
  for (const auto& ids : tokenizer.encode_batch(corpus)) lengths.push_back(static_cast<int64_t>(ids.size()));
  const int64_t world = 2, max_length = 512;
  for (const int64_t budget : {2048, 8192}) {
    const auto o = BucketBatchSamplerOptions().max_tokens(budget).max_length(max_length).num_replicas(world).seed(0);
    std::vector<Batch> bucketed;
    for (const auto& rank : every_rank(lengths, o, 0)) bucketed.insert(bucketed.end(), rank.begin(), rank.end());
    size_t sequences = 0;
    for (const Batch& b : bucketed) sequences += b.indices.size();
    const auto mean_size = static_cast<int64_t>(std::lround(static_cast<double>(sequences) / bucketed.size()));
    std::vector<Batch> fixed;
    for (int64_t r = 0; r < world; ++r) {
      DistributedSampler order(static_cast<int64_t>(lengths.size()), DistributedSamplerOptions().num_replicas(world).rank(r));
      const torch::Tensor idx = order.indices();
      for (int64_t start = 0; start < idx.numel(); start += mean_size) {
        Batch b;
        for (int64_t k = start; k < std::min(idx.numel(), start + mean_size); ++k) {
          const int64_t len = std::min(lengths[idx[k].item<int64_t>()], max_length);
          b.indices.push_back(idx[k].item<int64_t>());
          b.length = std::max(b.length, len);
          b.tokens += len;
        }
        fixed.push_back(b);
      }
    }
    const double ours = padding_fraction(bucketed), theirs = padding_fraction(fixed);
    std::cout << "fortunes, " << lengths.size() << " entries, 2 ranks, max_tokens " << budget << ": bucketed "
              << bucketed.size() << " batches (mean " << mean_size << " sequences) pad " << 100 * ours << "% of tokens; "
              << "fixed-size batches of " << mean_size << ": " << fixed.size() << " batches pad " << 100 * theirs << "%\n";
    EXPECT_LT(ours, theirs / 4);
  }
}

}  // namespace
}  // namespace lockstep::data
