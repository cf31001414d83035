#include "lockstep/data/tokenizer_trainer.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "lockstep/data/bpe_trainer.h"
#include "lockstep/data/byte_level.h"
#include "lockstep/data/pre_tokenizer.h"
#include "lockstep/data/unicode.h"

namespace lockstep::data {

namespace {

constexpr int64_t kByteAlphabet = 256;

// Words longer than kMaxTrainingWordBytes, cut into pieces of at most that many bytes that end on
// a character boundary (see tokenizer_trainer.h).
void count_pieces(std::string_view word, std::unordered_map<std::string, int64_t>& counts) {
  while (word.size() > kMaxTrainingWordBytes) {
    size_t cut = kMaxTrainingWordBytes;
    while (cut > 0 && (static_cast<uint8_t>(word[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
    if (cut == 0) cut = kMaxTrainingWordBytes;  // no boundary: not UTF-8, bytes are the symbols
    ++counts[std::string(word.substr(0, cut))];
    word.remove_prefix(cut);
  }
  ++counts[std::string(word)];
}

// Word -> count, sorted by word so that training does not depend on hash order.
std::map<std::string, int64_t> count_words(const std::vector<std::string>& corpus, PreTokenizerKind kind,
                                           const BertNormalizer* normalizer) {
  std::unordered_map<std::string, int64_t> counts;
  std::vector<std::string_view> words;
  std::string normalized;
  for (const std::string& entry : corpus) {
    if (normalizer) normalized = normalizer->normalize(entry);
    words.clear();
    pre_tokenize(kind, normalizer ? std::string_view(normalized) : std::string_view(entry), words);
    for (const std::string_view w : words) count_pieces(w, counts);
  }
  return {counts.begin(), counts.end()};
}

}  // namespace

Tokenizer train_tokenizer(const std::vector<std::string>& corpus, const TokenizerTrainerOptions& options,
                          const std::string& corpus_name) {
  const bool bpe = options.model() == TokenizerModelKind::kBpe;
  const std::vector<std::string> specials = options.special_tokens().value_or(
      bpe ? std::vector<std::string>{"<|endoftext|>"} : std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"});
  TORCH_CHECK_VALUE(std::set<std::string>(specials.begin(), specials.end()).size() == specials.size(),
                    "tokenizer training: the special tokens repeat one: ", c10::Join(" ", specials));
  const bool has_text = std::any_of(corpus.begin(), corpus.end(), [](const std::string& e) {
    return e.find_first_not_of(" \t\r\n") != std::string::npos;
  });
  TORCH_CHECK_VALUE(has_text, "tokenizer training: ", corpus_name, " is empty (", corpus.size(),
                    " entries, none with text); give a file with one entry per line");
  const int64_t least = static_cast<int64_t>(specials.size()) + kByteAlphabet;
  TORCH_CHECK_VALUE(!bpe || options.vocab_size() >= least, "tokenizer training: --vocab-size ", options.vocab_size(),
                    " is smaller than the byte alphabet (", kByteAlphabet, " tokens) plus ", specials.size(),
                    " special token(s); byte-level BPE needs at least ", least);
  TORCH_CHECK_VALUE(options.min_frequency() >= 0, "tokenizer training: min_frequency=", options.min_frequency(),
                    " must be at least 0");

  BpeTrainerInput input;
  input.special_tokens = specials;
  input.vocab_size = options.vocab_size();
  input.min_frequency = options.min_frequency();
  const BertNormalizer normalizer;  // BERT's defaults: lower-case, strip accents
  const auto counts = count_words(corpus, bpe ? PreTokenizerKind::kByteLevel : PreTokenizerKind::kBert,
                                  bpe ? nullptr : &normalizer);
  if (bpe) {
    for (int b = 0; b < kByteAlphabet; ++b)
      input.symbols.push_back(byte_level::to_symbols(std::string(1, static_cast<char>(b))));
    input.alphabet = input.symbols;
    for (const auto& [word, count] : counts) {
      std::vector<int32_t> symbols;
      symbols.reserve(word.size());
      for (const char c : word) symbols.push_back(static_cast<uint8_t>(c));  // byte b is symbol b
      input.words.emplace_back(std::move(symbols), count);
    }
  } else {
    const WordPieceOptions wordpiece;
    TORCH_CHECK_VALUE(std::find(specials.begin(), specials.end(), wordpiece.unk_token) != specials.end(),
                      "tokenizer training: WordPiece needs its unknown token ", wordpiece.unk_token,
                      " among the special tokens (", c10::Join(" ", specials), ")");
    input.continuing_subword_prefix = wordpiece.continuing_subword_prefix;
    std::set<char32_t> alphabet;
    std::unordered_map<std::string, int32_t> index;  // of each symbol in input.symbols
    std::string s;
    for (const auto& [word, count] : counts) {
      std::vector<int32_t> symbols;
      for (size_t pos = 0; pos < word.size();) {
        const char32_t c = unicode::next_code_point(word, pos);
        alphabet.insert(c);
        s = symbols.empty() ? "" : wordpiece.continuing_subword_prefix;
        unicode::append_utf8(s, c);
        const auto [it, fresh] = index.emplace(s, static_cast<int32_t>(input.symbols.size()));
        if (fresh) input.symbols.push_back(s);
        symbols.push_back(it->second);
      }
      input.words.emplace_back(std::move(symbols), count);
    }
    for (const char32_t c : alphabet) {
      input.alphabet.emplace_back();
      unicode::append_utf8(input.alphabet.back(), c);
    }
  }
  BpeTrainerResult trained = train_bpe(input);
  Tokenizer tokenizer = bpe ? Tokenizer(BpeModel(std::move(trained.vocab), std::move(trained.merges)))
                            : Tokenizer(WordPieceModel(std::move(trained.vocab)), normalizer);
  tokenizer.add_special_tokens(specials);
  return tokenizer;
}

}  // namespace lockstep::data
