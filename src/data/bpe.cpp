#include "lockstep/data/bpe.h"

#include <c10/util/Exception.h>

#include <functional>
#include <limits>
#include <queue>

#include "lockstep/data/byte_level.h"
#include "lockstep/data/unicode.h"

namespace lockstep::data {

BpeModel::BpeModel(std::vector<std::string> vocab, std::vector<std::pair<std::string, std::string>> merges)
    : vocab_(std::move(vocab)), merges_(std::move(merges)) {
  TORCH_CHECK_VALUE(vocab_.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                    "BPE: a vocabulary of ", vocab_.size(), " tokens is too large");
  ids_.reserve(vocab_.size());
  for (size_t id = 0; id < vocab_.size(); ++id) {
    const bool fresh = ids_.emplace(vocab_[id], static_cast<int32_t>(id)).second;
    TORCH_CHECK_VALUE(fresh, "BPE: token '", vocab_[id], "' appears twice in the vocabulary (ids ",
                      ids_.at(vocab_[id]), " and ", id, ")");
  }
  merge_of_pair_.reserve(merges_.size());
  for (size_t rank = 0; rank < merges_.size(); ++rank) {
    const auto& [left, right] = merges_[rank];
    const int64_t l = token_to_id(left), r = token_to_id(right), m = token_to_id(left + right);
    TORCH_CHECK_VALUE(l >= 0 && r >= 0 && m >= 0, "BPE: merge ", rank, " ('", left, "' '", right, "') uses a token ",
                      "that is not in the vocabulary: '", l < 0 ? left : r < 0 ? right : left + right, "'");
    // A pair listed twice keeps its first (lowest) rank, as a rank lookup does.
    merge_of_pair_.emplace(pair_key(static_cast<int32_t>(l), static_cast<int32_t>(r)),
                           Merge{static_cast<int32_t>(rank), static_cast<int32_t>(m)});
  }
  std::string symbol;
  for (int b = 0; b < 256; ++b) {
    symbol.clear();
    unicode::append_utf8(symbol, byte_level::byte_to_char(static_cast<uint8_t>(b)));
    byte_token_[b] = static_cast<int32_t>(token_to_id(symbol));
  }
}

int64_t BpeModel::token_to_id(const std::string& token) const {
  const auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

// Note [BPE merges in n log n]
// Applying the lowest-ranked merge present, leftmost first, until none applies, by scanning the
// word for it before each merge costs O(n^2) for a word of n bytes: 35-47 s for 100,000. Instead the
// word is a linked list of symbols and every adjacent pair that has a merge waits in a min-heap
// ordered by (rank, position), positions counting from the word's start so that a tie goes to
// the leftmost. A merge joins two symbols and queues the two pairs it makes with its neighbours;
// an entry whose pair no longer stands (a symbol merged away or grown) is dropped when it
// surfaces, recognised because the pair now there has another rank, each rank being one pair's.
// O(n log n), with the same result as the scan (Hugging Face's BPE model works this way too).
void BpeModel::encode_word(std::string_view word, std::vector<int64_t>& ids) const {
  TORCH_CHECK_VALUE(word.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()), "BPE: a word of ",
                    word.size(), " bytes is too long to encode (the most is 2^31 - 1)");
  struct Symbol {
    int32_t token;  // -1 once merged into the symbol on its left
    int32_t prev, next;  // positions of the neighbours, -1 at the ends
  };
  struct Candidate {
    int32_t rank, left;  // the merge, and the position of the pair's left symbol
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (const char c : word) {
    const int32_t t = byte_token_[static_cast<uint8_t>(c)];
    if (t < 0) continue;
    const auto at = static_cast<int32_t>(symbols.size());
    if (at > 0) symbols.back().next = at;
    symbols.push_back({t, at - 1, -1});
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  const auto queue_pair = [&](int32_t left) {
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const auto it = merge_of_pair_.find(pair_key(symbols[left].token, symbols[right].token));
    if (it != merge_of_pair_.end()) heap.push({it->second.rank, left});
  };
  for (int32_t i = 0; i < static_cast<int32_t>(symbols.size()); ++i) queue_pair(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[c.left];
    if (left.token < 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const auto it = merge_of_pair_.find(pair_key(left.token, right.token));
    if (it == merge_of_pair_.end() || it->second.rank != c.rank) continue;  // stale
    left.token = it->second.result;
    right.token = -1;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    if (left.prev >= 0) queue_pair(left.prev);
    queue_pair(c.left);
  }
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].token);
}

}  // namespace lockstep::data
