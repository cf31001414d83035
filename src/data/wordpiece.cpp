#include "lockstep/data/wordpiece.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "lockstep/data/unicode.h"

namespace lockstep::data {

WordPieceModel::WordPieceModel(std::vector<std::string> vocab, WordPieceOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  TORCH_CHECK_VALUE(options_.max_input_chars_per_word > 0, "WordPiece: max_input_chars_per_word=",
                    options_.max_input_chars_per_word, " must be positive (BERT uses 100)");
  ids_.reserve(vocab_.size());
  for (size_t id = 0; id < vocab_.size(); ++id) {
    const bool fresh = ids_.emplace(vocab_[id], static_cast<int64_t>(id)).second;
    TORCH_CHECK_VALUE(fresh, "WordPiece: token '", vocab_[id], "' appears twice in the vocabulary (ids ",
                      ids_.at(vocab_[id]), " and ", id, ")");
    longest_token_bytes_ = std::max(longest_token_bytes_, vocab_[id].size());
  }
  unk_id_ = token_to_id(options_.unk_token);
  TORCH_CHECK_VALUE(unk_id_ >= 0, "WordPiece: the unknown token '", options_.unk_token,
                    "' is not in the vocabulary; add it (BERT's is [UNK])");
}

int64_t WordPieceModel::token_to_id(const std::string& token) const {
  const auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

void WordPieceModel::encode_word(std::string_view word, std::vector<int64_t>& ids) const {
  // Code point boundaries: pieces never split a character.
  std::vector<size_t> bounds;
  for (size_t pos = 0; pos < word.size();) {
    bounds.push_back(pos);
    unicode::next_code_point(word, pos);
  }
  bounds.push_back(word.size());
  const size_t chars = bounds.size() - 1;
  if (static_cast<int64_t>(chars) > options_.max_input_chars_per_word) {
    ids.push_back(unk_id_);
    return;
  }
  const size_t first_id = ids.size();
  const std::string& prefix = options_.continuing_subword_prefix;
  std::string piece;
  for (size_t start = 0; start < chars;) {
    int64_t found = -1;
    size_t end = chars;
    for (; end > start; --end) {
      const size_t bytes = bounds[end] - bounds[start];
      if (bytes + (start > 0 ? prefix.size() : 0) > longest_token_bytes_) continue;
      piece.assign(start > 0 ? prefix : std::string());
      piece.append(word.substr(bounds[start], bytes));
      found = token_to_id(piece);
      if (found >= 0) break;
    }
    if (found < 0) {
      ids.resize(first_id);
      ids.push_back(unk_id_);
      return;
    }
    ids.push_back(found);
    start = end;
  }
}

}  // namespace lockstep::data
