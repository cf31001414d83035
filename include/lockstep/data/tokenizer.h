#pragma once
// A text tokenizer in Hugging Face's shape: normalizer -> added tokens -> pre-tokenizer -> model,
// and back through a decoder; saved and loaded as the `tokenizer.json` that Hugging Face's
// `tokenizers` (Python/Rust) and tokenizers.js read. Two pipelines:
//   byte-level BPE (GPT-2): no normalizer, ByteLevel pre-tokenizer and decoder; any bytes encode.
//   WordPiece (BERT): BertNormalizer (lower-case, strip accents), BertPreTokenizer, "##" pieces,
//   [UNK] for what the vocabulary cannot spell, WordPiece decoder.
// No post-processor: encode() adds no [CLS]/[SEP] or end-of-text tokens; callers add what their
// task needs. Train one with train_tokenizer() (tokenizer_trainer.h).
//
// Note [Added tokens]: add_tokens and add_special_tokens follow Hugging Face: an empty token or one
// already added is skipped; a token the model vocabulary already has keeps its id but is now
// matched whole, before the model splits the text; any other token gets the next id. Both return
// how many tokens got a new id, so size() grew by exactly that much (what an embedding resize
// needs; Rust's tokenizers also counts a token the model already had). Special tokens are matched
// in the raw text, never normalized or split, and decode(ids, true) drops them.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "lockstep/data/added_vocabulary.h"
#include "lockstep/data/bpe.h"
#include "lockstep/data/normalizer.h"
#include "lockstep/data/wordpiece.h"

namespace lockstep::data {

enum class TokenizerModelKind { kBpe, kWordPiece };
const std::vector<std::string>& tokenizer_model_names();  // bpe, wordpiece

class Tokenizer {
 public:
  explicit Tokenizer(BpeModel model);
  Tokenizer(WordPieceModel model, BertNormalizer normalizer);

  // Reads a tokenizer.json; errors name the file and the field that is wrong.
  static Tokenizer load(const std::string& path);
  static Tokenizer from_json(const std::string& text, const std::string& source = "tokenizer.json");
  std::string to_json() const;  // Hugging Face's layout, vocabulary in id order
  void save(const std::string& path) const;  // atomic: the old file survives a failed write
  // Note [Tokenizer fingerprint]: "<size> tokens, fnv1a64 <16 hex digits>", the 64-bit FNV-1a hash
  // of to_json(): equal for tokenizers that encode and decode alike (however their files were
  // laid out), different when any token, id, merge, added token or setting differs. A text run's
  // checkpoints record it, so a resume with another tokenizer (two ids swapped) is refused.
  std::string fingerprint() const;

  std::vector<int64_t> encode(std::string_view text) const;
  // Encodes many texts, sharing a cache of encoded words: the fast path for a corpus.
  std::vector<std::vector<int64_t>> encode_batch(const std::vector<std::string>& texts) const;
  // Throws c10::ValueError for an id outside [0, size()).
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  // See Note [Added tokens].
  int64_t add_tokens(const std::vector<std::string>& tokens);
  int64_t add_special_tokens(const std::vector<std::string>& tokens);
  int64_t add_tokens(const std::vector<AddedToken>& tokens);  // content, special, normalized used

  int64_t size() const;  // len(tokenizer) in Python: the largest id + 1
  int64_t token_to_id(const std::string& token) const;  // -1 when absent
  std::string id_to_token(int64_t id) const;
  TokenizerModelKind model_kind() const;
  const AddedVocabulary& added_vocabulary() const { return added_; }
  const std::variant<BpeModel, WordPieceModel>& model() const { return model_; }
  const BertNormalizer* normalizer() const { return normalizer_ ? &*normalizer_ : nullptr; }

 private:
  using WordCache = std::unordered_map<std::string, std::vector<int64_t>>;
  void encode_into(std::string_view text, WordCache& cache, std::vector<int64_t>& ids) const;
  void encode_model_text(std::string_view text, WordCache& cache, std::vector<int64_t>& ids) const;
  int64_t model_size() const;

  std::variant<BpeModel, WordPieceModel> model_;
  std::optional<BertNormalizer> normalizer_;
  AddedVocabulary added_;
};

}  // namespace lockstep::data
