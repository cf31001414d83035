#include "lockstep/data/normalizer.h"

#include "lockstep/data/unicode.h"

namespace lockstep::data {

std::string BertNormalizer::normalize(std::string_view text) const {
  namespace u = unicode;
  const bool strip = options_.strip_accents.value_or(options_.lowercase);
  std::string cleaned;
  cleaned.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const char32_t c = u::next_code_point(text, pos);
    if (options_.clean_text) {
      const bool tab_or_newline = c == '\t' || c == '\n' || c == '\r';
      if (c == 0 || c == u::kReplacementCharacter || (!tab_or_newline && (u::categories(c) & u::kControl))) continue;
      if (u::is_whitespace(c)) {
        cleaned += ' ';
        continue;
      }
    }
    const bool spaced = options_.handle_chinese_chars && u::is_cjk_ideograph(c);
    if (spaced) cleaned += ' ';
    if (options_.lowercase) {
      u::append_lowercase(cleaned, c);
    } else {
      u::append_utf8(cleaned, c);
    }
    if (spaced) cleaned += ' ';
  }
  if (!strip) return cleaned;
  std::string out;
  out.reserve(cleaned.size());
  for (size_t pos = 0; pos < cleaned.size();) u::append_without_accents(out, u::next_code_point(cleaned, pos));
  return out;
}

}  // namespace lockstep::data
