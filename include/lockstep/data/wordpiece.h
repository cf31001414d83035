#pragma once
// WordPiece (BERT; Hugging Face's WordPiece model): a word is split greedily into the longest
// vocabulary tokens from its start; every piece after the first carries the continuation prefix
// ("##"). A word with a part no token covers, or longer than max_input_chars_per_word code points,
// becomes the unknown token as a whole.

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lockstep::data {

struct WordPieceOptions {
  std::string unk_token = "[UNK]";
  std::string continuing_subword_prefix = "##";
  int64_t max_input_chars_per_word = 100;
};

class WordPieceModel {
 public:
  // `vocab`: token strings by id, ids 0..size-1; it must hold options.unk_token.
  WordPieceModel(std::vector<std::string> vocab, WordPieceOptions options = {});

  // Appends the ids of `word` (normalized UTF-8, no whitespace) to `ids`.
  void encode_word(std::string_view word, std::vector<int64_t>& ids) const;

  int64_t size() const { return static_cast<int64_t>(vocab_.size()); }
  const std::string& id_to_token(int64_t id) const { return vocab_.at(static_cast<size_t>(id)); }
  int64_t token_to_id(const std::string& token) const;  // -1 when absent
  const std::vector<std::string>& vocab() const { return vocab_; }
  const WordPieceOptions& options() const { return options_; }
  int64_t unk_id() const { return unk_id_; }

 private:
  std::vector<std::string> vocab_;
  WordPieceOptions options_;
  std::unordered_map<std::string, int64_t> ids_;
  int64_t unk_id_ = -1;
  size_t longest_token_bytes_ = 0;  // bounds the search for the longest piece
};

}  // namespace lockstep::data
