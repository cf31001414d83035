#include "lockstep/data/unicode.h"

#include <algorithm>
#include <array>

#include "unicode_tables.h"

namespace lockstep::data::unicode {

namespace {

using unicode_tables::Mapping;

// ASCII is most of any corpus: its categories are looked up in a table built once.
const std::array<uint8_t, 128>& ascii_categories() {
  static const std::array<uint8_t, 128> table = [] {
    std::array<uint8_t, 128> t{};
    size_t run = 0;
    for (char32_t c = 0; c < 128; ++c) {
      while (run + 1 < unicode_tables::kCategoryRunCount && unicode_tables::kCategoryRuns[run + 1].first <= c) ++run;
      t[c] = unicode_tables::kCategoryRuns[run].bits;
    }
    return t;
  }();
  return table;
}

const char* find_mapping(const Mapping* table, size_t count, char32_t c) {
  const Mapping* end = table + count;
  const Mapping* it = std::lower_bound(table, end, c, [](const Mapping& m, char32_t v) { return m.code_point < v; });
  return it != end && it->code_point == c ? it->utf8 : nullptr;
}

}  // namespace

char32_t next_code_point(std::string_view text, size_t& pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char b0 = byte(pos);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  size_t length = 0;
  char32_t c = 0;
  char32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    length = 2, c = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    length = 3, c = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    length = 4, c = b0 & 0x07, min = 0x10000;
  } else {
    ++pos;
    return kReplacementCharacter;
  }
  if (pos + length > text.size()) {
    ++pos;
    return kReplacementCharacter;
  }
  for (size_t i = 1; i < length; ++i) {
    const unsigned char b = byte(pos + i);
    if ((b & 0xC0) != 0x80) {
      ++pos;
      return kReplacementCharacter;
    }
    c = (c << 6) | (b & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
    ++pos;
    return kReplacementCharacter;
  }
  pos += length;
  return c;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

uint8_t categories(char32_t c) {
  if (c < 128) return ascii_categories()[c];
  const auto* begin = unicode_tables::kCategoryRuns;
  const auto* end = begin + unicode_tables::kCategoryRunCount;
  const auto* it = std::upper_bound(begin, end, c, [](char32_t v, const unicode_tables::CategoryRun& r) { return v < r.first; });
  return (it - 1)->bits;  // the first run starts at U+0000, so `it` is never `begin`
}

bool is_bert_punctuation(char32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
  return c >= 128 && (categories(c) & kPunctuation);
}

bool is_cjk_ideograph(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

void append_lowercase(std::string& out, char32_t c) {
  if (c < 128) {
    out += static_cast<char>(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
    return;
  }
  if (const char* lower = find_mapping(unicode_tables::kLowercase, unicode_tables::kLowercaseCount, c)) {
    out += lower;
  } else {
    append_utf8(out, c);
  }
}

void append_without_accents(std::string& out, char32_t c) {
  if (c < 128) {
    out += static_cast<char>(c);
    return;
  }
  // Hangul syllables decompose by formula (Unicode 3.12) into two or three jamo, none of them marks.
  constexpr char32_t kSyllableBase = 0xAC00, kLeadBase = 0x1100, kVowelBase = 0x1161, kTrailBase = 0x11A7;
  constexpr char32_t kVowels = 21, kTrails = 28, kSyllables = 11172;
  if (c >= kSyllableBase && c < kSyllableBase + kSyllables) {
    const char32_t index = c - kSyllableBase;
    append_utf8(out, kLeadBase + index / (kVowels * kTrails));
    append_utf8(out, kVowelBase + (index % (kVowels * kTrails)) / kTrails);
    if (index % kTrails != 0) append_utf8(out, kTrailBase + index % kTrails);
    return;
  }
  if (categories(c) & kNonspacingMark) return;
  if (const char* stripped = find_mapping(unicode_tables::kStripAccents, unicode_tables::kStripAccentsCount, c)) {
    out += stripped;
  } else {
    append_utf8(out, c);
  }
}

}  // namespace lockstep::data::unicode
