#include "lockstep/data/bpe_trainer.h"

#include <c10/util/Exception.h>

#include <queue>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

namespace lockstep::data {

namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
int32_t left_of(uint64_t key) { return static_cast<int32_t>(key >> 32); }
int32_t right_of(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

// A heap entry: (count, pair). The heap is lazy: an entry whose count is no longer the pair's is
// dropped when it surfaces, and every pair whose count grows is pushed again.
struct Candidate {
  int64_t count;
  uint64_t pair;
  bool operator<(const Candidate& o) const {  // max-heap on count, then on the smaller (older) pair
    return std::tie(count, o.pair) < std::tie(o.count, pair);
  }
};

}  // namespace

BpeTrainerResult train_bpe(const BpeTrainerInput& input) {
  BpeTrainerResult result;
  std::unordered_map<std::string, int32_t> ids;
  const auto intern = [&](const std::string& token) {
    const auto [it, fresh] = ids.emplace(token, static_cast<int32_t>(result.vocab.size()));
    if (fresh) result.vocab.push_back(token);
    return it->second;
  };
  for (const auto& t : input.special_tokens) intern(t);
  for (const auto& t : input.alphabet) intern(t);

  // Words as token ids; pair counts weighted by word counts; where each pair occurs (word indices,
  // possibly repeated or stale: checked when used).
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> counts;
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words;
  // Symbols get ids in the order the words first use them, after the specials and the alphabet.
  std::vector<int32_t> id_of_symbol(input.symbols.size(), -1);
  for (const auto& [symbols, count] : input.words) {
    std::vector<int32_t> w;
    w.reserve(symbols.size());
    for (const int32_t s : symbols) {
      TORCH_CHECK_VALUE(s >= 0 && static_cast<size_t>(s) < input.symbols.size(), "train_bpe: symbol index ", s,
                        " is not one of the ", input.symbols.size(), " symbols");
      if (id_of_symbol[s] < 0) id_of_symbol[s] = intern(input.symbols[s]);
      w.push_back(id_of_symbol[s]);
    }
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      const uint64_t key = pair_key(w[i], w[i + 1]);
      pair_count[key] += count;
      pair_words[key].push_back(static_cast<int32_t>(words.size()));
    }
    words.push_back(std::move(w));
    counts.push_back(count);
  }
  TORCH_CHECK_VALUE(static_cast<int64_t>(result.vocab.size()) <= input.vocab_size, "tokenizer training: vocab_size=",
                    input.vocab_size, " is smaller than the ", input.special_tokens.size(), " special tokens plus the ",
                    result.vocab.size() - input.special_tokens.size(),
                    " symbols of the alphabet; ask for at least ", result.vocab.size());

  std::priority_queue<Candidate> heap;
  for (const auto& [key, count] : pair_count) heap.push({count, key});
  std::unordered_set<uint64_t> merged;
  const std::string& prefix = input.continuing_subword_prefix;
  while (static_cast<int64_t>(result.vocab.size()) < input.vocab_size && !heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    const int64_t current = pair_count[top.pair];
    if (current != top.count) {  // stale: requeue at the pair's count now
      if (current > 0) heap.push({current, top.pair});
      continue;
    }
    if (top.count < std::max<int64_t>(input.min_frequency, 1)) break;
    const int32_t left = left_of(top.pair), right = right_of(top.pair);
    std::string right_text = result.vocab[right];
    if (!prefix.empty() && right_text.compare(0, prefix.size(), prefix) == 0) right_text.erase(0, prefix.size());
    const std::string left_text = result.vocab[left];
    // Two pairs can spell the same token ("a"+"bc", "ab"+"c"): it keeps its first id.
    const int32_t made = intern(left_text + right_text);
    if (merged.insert(top.pair).second) result.merges.emplace_back(left_text, result.vocab[right]);

    std::unordered_set<uint64_t> grown;
    std::vector<int32_t> where = std::move(pair_words[top.pair]);
    pair_words.erase(top.pair);
    std::unordered_set<int32_t> done;
    for (const int32_t wi : where) {
      if (!done.insert(wi).second) continue;
      auto& w = words[wi];
      const int64_t c = counts[wi];
      for (size_t i = 0; i + 1 < w.size();) {
        if (w[i] != left || w[i + 1] != right) {
          ++i;
          continue;
        }
        if (i > 0) {
          pair_count[pair_key(w[i - 1], left)] -= c;
          const uint64_t k = pair_key(w[i - 1], made);
          pair_count[k] += c;
          pair_words[k].push_back(wi);
          grown.insert(k);
        }
        if (i + 2 < w.size()) {
          pair_count[pair_key(right, w[i + 2])] -= c;
          const uint64_t k = pair_key(made, w[i + 2]);
          pair_count[k] += c;
          pair_words[k].push_back(wi);
          grown.insert(k);
        }
        pair_count[top.pair] -= c;
        w[i] = made;
        w.erase(w.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        ++i;
      }
    }
    for (const uint64_t k : grown)
      if (pair_count[k] > 0) heap.push({pair_count[k], k});
  }
  return result;
}

}  // namespace lockstep::data
