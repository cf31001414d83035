#include "lockstep/data/pre_tokenizer.h"

#include "lockstep/data/unicode.h"

namespace lockstep::data {

namespace {

namespace u = unicode;

// The code point at `pos` without advancing; U+0000 past the end (it is in no class we test).
char32_t peek(std::string_view text, size_t pos, size_t* next = nullptr) {
  size_t p = pos;
  const char32_t c = pos < text.size() ? u::next_code_point(text, p) : 0;
  if (next) *next = p;
  return c;
}

// Length of "'s", "'t", "'re", "'ve", "'m", "'ll" or "'d" at text[pos] (which is '\''), else 0.
// The pattern tries them in that order and they are case-sensitive.
size_t contraction(std::string_view text, size_t pos) {
  for (const std::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"})
    if (text.substr(pos + 1, suffix.size()) == suffix) return 1 + suffix.size();
  return 0;
}

// End of the run starting at `pos` of code points for which `in_class` holds.
template <typename Pred>
size_t run_end(std::string_view text, size_t pos, Pred in_class) {
  while (pos < text.size()) {
    size_t next = pos;
    if (!in_class(u::next_code_point(text, next))) break;
    pos = next;
  }
  return pos;
}

void byte_level_split(std::string_view text, std::vector<std::string_view>& words) {
  const auto other = [](char32_t c) { return !(u::categories(c) & (u::kLetter | u::kNumber | u::kWhitespace)); };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = 0;
    if (text[pos] == '\'') end = pos + contraction(text, pos);
    if (end <= pos) {
      const size_t body = text[pos] == ' ' ? pos + 1 : pos;  // the optional leading space
      const char32_t c = peek(text, body);
      if (body < text.size() && u::is_letter(c)) {
        end = run_end(text, body, u::is_letter);
      } else if (body < text.size() && u::is_number(c)) {
        end = run_end(text, body, u::is_number);
      } else if (body < text.size() && other(c)) {
        end = run_end(text, body, other);
      }
    }
    if (end <= pos) {
      // Here text[pos] is whitespace. \s+(?!\S): the whole run at the end of the text, else the
      // run less its last character; \s+: a single whitespace character followed by a non-space.
      const size_t run = run_end(text, pos, u::is_whitespace);
      if (run == text.size()) {
        end = run;
      } else {
        size_t last = pos, p = pos;
        while (p < run) {  // the start of the run's last code point
          last = p;
          u::next_code_point(text, p);
        }
        end = last > pos ? last : run;
      }
    }
    words.push_back(text.substr(pos, end - pos));
    pos = end;
  }
}

void bert_split(std::string_view text, std::vector<std::string_view>& words) {
  size_t word_start = std::string_view::npos;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    const char32_t c = u::next_code_point(text, pos);
    const bool space = u::is_whitespace(c);
    const bool punct = !space && u::is_bert_punctuation(c);
    if (space || punct) {
      if (word_start != std::string_view::npos) words.push_back(text.substr(word_start, start - word_start));
      word_start = std::string_view::npos;
      if (punct) words.push_back(text.substr(start, pos - start));
    } else if (word_start == std::string_view::npos) {
      word_start = start;
    }
  }
  if (word_start != std::string_view::npos) words.push_back(text.substr(word_start));
}

}  // namespace

void pre_tokenize(PreTokenizerKind kind, std::string_view text, std::vector<std::string_view>& words) {
  if (kind == PreTokenizerKind::kByteLevel) {
    byte_level_split(text, words);
  } else {
    bert_split(text, words);
  }
}

}  // namespace lockstep::data
