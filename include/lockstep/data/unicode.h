#pragma once
// The few Unicode facts the tokenizers need, on UTF-8 text, without ICU: a code point's general
// category (letters, numbers, nonspacing marks, punctuation, JavaScript's \s, controls), lower case
// and accent stripping. The tables come from Node's Unicode data (scripts/unicode_tables.mjs), the
// same data the JavaScript tokenizer our tests compare against uses.
//
// Note [Unicode limits]: lower-casing is per code point (no final-sigma rule: a word-final 'Σ'
// becomes 'σ', where JavaScript and Rust give 'ς'); accent stripping decomposes each code point on
// its own (NFD without the canonical reordering of combining marks, which only matters for the
// rare spacing marks with a nonzero combining class, since nonspacing marks are removed anyway).

#include <cstdint>
#include <string>
#include <string_view>

namespace lockstep::data::unicode {

enum CategoryBits : uint8_t {
  kLetter = 1 << 0,           // \p{L}
  kNumber = 1 << 1,           // \p{N}
  kNonspacingMark = 1 << 2,   // \p{Mn}
  kPunctuation = 1 << 3,      // \p{P}
  kWhitespace = 1 << 4,       // JavaScript's \s (the White_Space set plus U+FEFF, without U+0085)
  kControl = 1 << 5,          // \p{Cc}, \p{Cf}, \p{Co}, \p{Cs}
};

constexpr char32_t kReplacementCharacter = 0xFFFD;

// Decodes the code point at text[pos] and advances `pos` past it. An invalid or truncated sequence
// yields U+FFFD and advances one byte, so every byte is consumed exactly once.
char32_t next_code_point(std::string_view text, size_t& pos);

void append_utf8(std::string& out, char32_t c);

uint8_t categories(char32_t c);  // CategoryBits
inline bool is_letter(char32_t c) { return categories(c) & kLetter; }
inline bool is_number(char32_t c) { return categories(c) & kNumber; }
inline bool is_whitespace(char32_t c) { return categories(c) & kWhitespace; }
// BERT's punctuation: \p{P} or any ASCII character in !-/ :-@ [-` {-~ (symbols such as $ + < = > ^ ` | ~ too).
bool is_bert_punctuation(char32_t c);
// CJK Unified Ideographs and their extensions, the blocks BERT puts spaces around.
bool is_cjk_ideograph(char32_t c);

// Appends c's lower case (one or more code points). See Note [Unicode limits].
void append_lowercase(std::string& out, char32_t c);
// Appends c's canonical decomposition without nonspacing marks (nothing for a mark itself).
void append_without_accents(std::string& out, char32_t c);

}  // namespace lockstep::data::unicode
