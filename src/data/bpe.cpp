#include "lockstep/data/bpe.h"

#include <c10/util/Exception.h>

#include <limits>

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

void BpeModel::encode_word(std::string_view word, std::vector<int64_t>& ids) const {
  // Words are short (a few bytes to a few dozen), so a scan for the lowest-ranked pair per merge,
  // O(length^2), beats a heap; callers cache whole words (Tokenizer::encode).
  std::vector<int32_t> tokens;
  tokens.reserve(word.size());
  for (const char c : word) {
    const int32_t t = byte_token_[static_cast<uint8_t>(c)];
    if (t >= 0) tokens.push_back(t);
  }
  while (tokens.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    int32_t best_result = -1;
    size_t best_at = 0;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      const auto it = merge_of_pair_.find(pair_key(tokens[i], tokens[i + 1]));
      if (it != merge_of_pair_.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank;
        best_result = it->second.result;
        best_at = i;
      }
    }
    if (best_result < 0) break;
    tokens[best_at] = best_result;
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
  }
  ids.insert(ids.end(), tokens.begin(), tokens.end());
}

}  // namespace lockstep::data
