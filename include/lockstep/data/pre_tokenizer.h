#pragma once
// Pre-tokenizers: split normalized text into the words a tokenizer model encodes one at a time.
// The words are views into the text; the model never sees text across a word boundary.

#include <string_view>
#include <vector>

namespace lockstep::data {

enum class PreTokenizerKind {
  // GPT-2's split (Hugging Face ByteLevel with use_regex): the pattern
  //   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  // so a word carries its leading space, and a run of spaces gives all but its last space to a
  // word of its own. No prefix space is added.
  kByteLevel,
  // BERT's split (BertPreTokenizer): whitespace separates words and is dropped; every punctuation
  // character (unicode::is_bert_punctuation) is a word of its own.
  kBert,
};

// Appends the words of `text` to `words`.
void pre_tokenize(PreTokenizerKind kind, std::string_view text, std::vector<std::string_view>& words);

}  // namespace lockstep::data
