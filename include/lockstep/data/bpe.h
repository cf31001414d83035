#pragma once
// Byte-level byte-pair encoding (GPT-2; Hugging Face's BPE model behind a ByteLevel pre-tokenizer).
// A word's bytes start as one token each (the 256 alphabet characters of byte_level.h); then the
// merge of lowest rank present among adjacent tokens is applied, leftmost first, until none applies.

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lockstep::data {

class BpeModel {
 public:
  // `vocab`: token strings (byte-level characters) by id, ids 0..size-1. `merges`: pairs of tokens
  // in rank order; both halves and their concatenation must be in `vocab`.
  BpeModel(std::vector<std::string> vocab, std::vector<std::pair<std::string, std::string>> merges);

  // Appends the ids of `word` (raw bytes, e.g. " hello") to `ids`. A byte whose alphabet character
  // is not in the vocabulary is dropped, as Hugging Face does for a BPE model without unk_token.
  void encode_word(std::string_view word, std::vector<int64_t>& ids) const;

  int64_t size() const { return static_cast<int64_t>(vocab_.size()); }
  const std::string& id_to_token(int64_t id) const { return vocab_.at(static_cast<size_t>(id)); }
  int64_t token_to_id(const std::string& token) const;  // -1 when absent
  const std::vector<std::string>& vocab() const { return vocab_; }
  const std::vector<std::pair<std::string, std::string>>& merges() const { return merges_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  // token id of the merged pair
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  std::vector<std::string> vocab_;
  std::vector<std::pair<std::string, std::string>> merges_;
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<uint64_t, Merge> merge_of_pair_;
  int32_t byte_token_[256];  // id of each byte's alphabet character, -1 when not in the vocabulary
};

}  // namespace lockstep::data
