#pragma once
// BERT's normalizer (Hugging Face's BertNormalizer), the one WordPiece tokenizers use: drops
// control characters, NUL and U+FFFD, turns every whitespace character into ' ', puts spaces around
// CJK ideographs, lower-cases and strips accents. See Note [Unicode limits] in unicode.h.

#include <optional>
#include <string>
#include <string_view>

namespace lockstep::data {

struct BertNormalizerOptions {
  bool clean_text = true;
  bool handle_chinese_chars = true;
  std::optional<bool> strip_accents;  // unset: strip accents exactly when lower-casing (BERT's rule)
  bool lowercase = true;
};

class BertNormalizer {
 public:
  explicit BertNormalizer(BertNormalizerOptions options = {}) : options_(options) {}
  std::string normalize(std::string_view text) const;
  const BertNormalizerOptions& options() const { return options_; }

 private:
  BertNormalizerOptions options_;
};

}  // namespace lockstep::data
