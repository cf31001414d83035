#pragma once
// Tokens added to a tokenizer after training (Hugging Face's AddedVocabulary): matched in the text
// before the model splits it, so an added token is always one id. Special tokens (and any token
// with normalized == false) are matched in the raw text, so they are never lower-cased or split;
// the others are matched in the normalized text, after their own content has been normalized the
// same way. Where several tokens match, the leftmost, then the longest, wins.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lockstep::data {

struct AddedToken {
  std::string content;
  int64_t id = -1;
  bool special = false;    // skipped by decode(skip_special_tokens); never normalized by default
  bool normalized = true;  // Hugging Face's default is !special
};

// One piece of a text split by added tokens: an added token (id >= 0), or text for the model (-1).
struct TextPiece {
  std::string_view text;
  int64_t id = -1;
};

class AddedVocabulary {
 public:
  // Registers `token` (whose id is set); `normalized_content` is its content after the tokenizer's
  // normalizer, used when token.normalized.
  void add(const AddedToken& token, const std::string& normalized_content);

  const std::vector<AddedToken>& tokens() const { return tokens_; }  // in the order added
  const AddedToken* find_id(int64_t id) const;
  const AddedToken* find_content(const std::string& content) const;

  // Splits `text` by the tokens matched in raw text, or in normalized text, appending to `out`.
  void split_raw(std::string_view text, std::vector<TextPiece>& out) const { raw_.split(text, out); }
  void split_normalized(std::string_view text, std::vector<TextPiece>& out) const { normalized_.split(text, out); }

 private:
  // A byte trie; the root's children are a table, since every position of the text starts there.
  class Trie {
   public:
    Trie() { root_.fill(-1); }
    void insert(const std::string& key, int64_t id);
    void split(std::string_view text, std::vector<TextPiece>& out) const;

   private:
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> children;
      int64_t id = -1;  // the token ending here
    };
    int32_t child(int32_t node, unsigned char byte) const;
    std::array<int32_t, 256> root_;
    std::vector<Node> nodes_;
  };

  std::vector<AddedToken> tokens_;
  std::unordered_map<int64_t, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  Trie raw_, normalized_;
};

}  // namespace lockstep::data
