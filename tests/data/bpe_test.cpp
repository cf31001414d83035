// BPE encoding of long words (Note [BPE merges in n log n]) against the definition: apply the
// lowest-ranked merge present, leftmost first, until none applies, found by scanning the word
// before every merge (what lockstep did before, O(n^2): 35 s for a word of 100,000 bytes).
#include "lockstep/data/bpe.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <random>

namespace lockstep::data {
namespace {

// A byte-level BPE over the alphabet "abcd" with `merges` merges of random pairs of tokens.
BpeModel random_model(int merges, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> vocab{"a", "b", "c", "d"};
  std::vector<std::pair<std::string, std::string>> pairs;
  for (int i = 0; i < merges; ++i) {
    const std::string& l = vocab[rng() % vocab.size()];
    const std::string& r = vocab[rng() % vocab.size()];
    if (l.size() + r.size() > 12) continue;
    pairs.emplace_back(l, r);
    if (std::find(vocab.begin(), vocab.end(), l + r) == vocab.end()) vocab.push_back(l + r);
  }
  return BpeModel(vocab, pairs);
}

// The definition, written out: scan for the lowest rank before every merge.
std::vector<int64_t> encode_by_scanning(const BpeModel& m, const std::string& word) {
  std::map<std::pair<int64_t, int64_t>, int64_t> rank;
  for (size_t r = 0; r < m.merges().size(); ++r)
    rank.emplace(std::make_pair(m.token_to_id(m.merges()[r].first), m.token_to_id(m.merges()[r].second)), r);
  std::vector<int64_t> t;
  for (const char c : word) t.push_back(m.token_to_id(std::string(1, c)));
  for (;;) {
    size_t best = t.size();
    int64_t best_rank = INT64_MAX;
    for (size_t i = 0; i + 1 < t.size(); ++i) {
      const auto it = rank.find({t[i], t[i + 1]});
      if (it != rank.end() && it->second < best_rank) best_rank = it->second, best = i;
    }
    if (best == t.size()) return t;
    t[best] = m.token_to_id(m.id_to_token(t[best]) + m.id_to_token(t[best + 1]));
    t.erase(t.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
}

std::string random_word(size_t length, unsigned seed, int letters = 4) {
  std::mt19937 rng(seed);
  std::string w(length, 'a');
  for (char& c : w) c = static_cast<char>('a' + rng() % letters);
  return w;
}

TEST(BpeModel, EncodesAsTheMergeScanDoesWithTiesToTheLeftmost) {
  for (unsigned seed = 0; seed < 40; ++seed) {
    const BpeModel m = random_model(60, seed);
    for (const size_t length : {0, 1, 2, 3, 7, 50, 300}) {
      const std::string word = random_word(length, seed * 1000 + static_cast<unsigned>(length), seed % 2 ? 2 : 4);
      std::vector<int64_t> ids;
      m.encode_word(word, ids);
      ASSERT_EQ(ids, encode_by_scanning(m, word)) << "seed " << seed << " word '" << word << "'";
    }
  }
  // Runs of one letter, where every pair is the same merge: "aaa" merges its leftmost pair first.
  const BpeModel aa({"a", "aa", "aaaa"}, {{"a", "a"}, {"aa", "aa"}});
  std::vector<int64_t> ids;
  aa.encode_word("aaaaaaa", ids);
  EXPECT_EQ(ids, (std::vector<int64_t>{2, 1, 0}));
}

// 200,000 bytes took over a minute; now well under a second. The 4,000-byte word is also checked
// against the scan, token for token.
TEST(BpeModel, ALongWordEncodesInNLogNWithTheScansResult) {
  const BpeModel m = random_model(300, 7);
  const std::string medium = random_word(4000, 11);
  std::vector<int64_t> ids;
  m.encode_word(medium, ids);
  EXPECT_EQ(ids, encode_by_scanning(m, medium));

  for (const int letters : {1, 4}) {
    const std::string word = random_word(200000, 12, letters);
    const auto start = std::chrono::steady_clock::now();
    ids.clear();
    m.encode_word(word, ids);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(took, 5.0) << letters << " letter(s): the scan took over 60 s";
    std::string decoded;
    for (const int64_t id : ids) decoded += m.id_to_token(id);
    EXPECT_EQ(decoded, word);
  }
}

}  // namespace
}  // namespace lockstep::data
