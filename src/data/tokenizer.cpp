#include "lockstep/data/tokenizer.h"

#include <c10/util/Exception.h>

#include "lockstep/core/names.h"
#include "lockstep/data/byte_level.h"
#include "lockstep/data/pre_tokenizer.h"
#include "lockstep/data/unicode.h"

namespace lockstep::data {

namespace {

// Hugging Face's clean_up_tokenization: the WordPiece decoder's cleanup of spaces before
// punctuation and contractions.
std::string clean_up_tokenization(std::string s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    const std::string f = from, t = to;
    for (size_t at = s.find(f); at != std::string::npos; at = s.find(f, at + t.size())) s.replace(at, f.size(), t);
  }
  return s;
}

// Bytes decoded from byte-level tokens may end mid-character or be invalid: such sequences become
// U+FFFD, as a UTF-8 decoder does.
std::string valid_utf8(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) unicode::append_utf8(out, unicode::next_code_point(bytes, pos));
  return out;
}

}  // namespace

const std::vector<std::string>& tokenizer_model_names() {
  static const std::vector<std::string> names{"bpe", "wordpiece"};
  return names;
}

Tokenizer::Tokenizer(BpeModel model) : model_(std::move(model)) {}

Tokenizer::Tokenizer(WordPieceModel model, BertNormalizer normalizer)
    : model_(std::move(model)), normalizer_(std::move(normalizer)) {}

TokenizerModelKind Tokenizer::model_kind() const {
  return std::holds_alternative<BpeModel>(model_) ? TokenizerModelKind::kBpe : TokenizerModelKind::kWordPiece;
}

int64_t Tokenizer::model_size() const {
  return std::visit([](const auto& m) { return m.size(); }, model_);
}

int64_t Tokenizer::size() const {
  int64_t n = model_size();
  for (const auto& t : added_.tokens()) n = std::max(n, t.id + 1);
  return n;
}

int64_t Tokenizer::token_to_id(const std::string& token) const {
  if (const AddedToken* t = added_.find_content(token)) return t->id;
  return std::visit([&](const auto& m) { return m.token_to_id(token); }, model_);
}

std::string Tokenizer::id_to_token(int64_t id) const {
  if (const AddedToken* t = added_.find_id(id)) return t->content;
  TORCH_CHECK_VALUE(id >= 0 && id < model_size(), "token id ", id, " is not in the vocabulary (ids 0 to ", size() - 1, ")");
  return std::visit([&](const auto& m) { return m.id_to_token(id); }, model_);
}

int64_t Tokenizer::add_tokens(const std::vector<std::string>& tokens) {
  std::vector<AddedToken> added;
  for (const auto& t : tokens) added.push_back({t, -1, false, true});
  return add_tokens(added);
}

int64_t Tokenizer::add_special_tokens(const std::vector<std::string>& tokens) {
  std::vector<AddedToken> added;
  for (const auto& t : tokens) added.push_back({t, -1, true, false});
  return add_tokens(added);
}

int64_t Tokenizer::add_tokens(const std::vector<AddedToken>& tokens) {
  int64_t fresh = 0;
  for (AddedToken token : tokens) {
    if (token.content.empty() || added_.find_content(token.content)) continue;
    const int64_t existing = std::visit([&](const auto& m) { return m.token_to_id(token.content); }, model_);
    token.id = existing >= 0 ? existing : size();
    fresh += existing >= 0 ? 0 : 1;
    added_.add(token, normalizer_ ? normalizer_->normalize(token.content) : token.content);
  }
  return fresh;
}

void Tokenizer::encode_model_text(std::string_view text, WordCache& cache, std::vector<int64_t>& ids) const {
  const bool bpe = model_kind() == TokenizerModelKind::kBpe;
  std::vector<std::string_view> words;
  pre_tokenize(bpe ? PreTokenizerKind::kByteLevel : PreTokenizerKind::kBert, text, words);
  std::string key;
  for (const std::string_view word : words) {
    key.assign(word);
    auto it = cache.find(key);
    if (it == cache.end()) {
      std::vector<int64_t> word_ids;
      std::visit([&](const auto& m) { m.encode_word(word, word_ids); }, model_);
      it = cache.emplace(key, std::move(word_ids)).first;
    }
    ids.insert(ids.end(), it->second.begin(), it->second.end());
  }
}

void Tokenizer::encode_into(std::string_view text, WordCache& cache, std::vector<int64_t>& ids) const {
  // See Note [Added tokens]: raw matches first, then normalize what is left, then normalized
  // matches, then the model.
  std::vector<TextPiece> raw;
  added_.split_raw(text, raw);
  std::vector<TextPiece> pieces;
  for (const TextPiece& piece : raw) {
    if (piece.id >= 0) {
      ids.push_back(piece.id);
      continue;
    }
    const std::string normalized = normalizer_ ? normalizer_->normalize(piece.text) : std::string(piece.text);
    pieces.clear();
    added_.split_normalized(normalized, pieces);
    for (const TextPiece& p : pieces) {
      if (p.id >= 0) {
        ids.push_back(p.id);
      } else {
        encode_model_text(p.text, cache, ids);
      }
    }
  }
}

std::vector<int64_t> Tokenizer::encode(std::string_view text) const {
  WordCache cache;
  std::vector<int64_t> ids;
  encode_into(text, cache, ids);
  return ids;
}

std::vector<std::vector<int64_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts) const {
  WordCache cache;
  std::vector<std::vector<int64_t>> out(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) encode_into(texts[i], cache, out[i]);
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const int64_t n = size();
  std::vector<std::string> tokens;
  std::vector<bool> is_added;
  for (const int64_t id : ids) {
    TORCH_CHECK_VALUE(id >= 0 && id < n, "decode: token id ", id, " is not in the vocabulary (ids 0 to ", n - 1, ")");
    const AddedToken* added = added_.find_id(id);
    if (added && added->special && skip_special_tokens) continue;
    // Hugging Face's tokenizers (0.23) decode an added token matched in normalized text as its
    // normalized content: "Linux" added to a lower-casing WordPiece decodes as "linux".
    const bool normalized = added && added->normalized && normalizer_;
    tokens.push_back(normalized ? normalizer_->normalize(added->content) : id_to_token(id));
    is_added.push_back(added != nullptr);
  }
  std::string out;
  if (model_kind() == TokenizerModelKind::kBpe) {
    // ByteLevel decoder: model tokens back to bytes; added tokens are text as they are.
    std::string bytes;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (is_added[i]) {
        out += valid_utf8(bytes);
        bytes.clear();
        out += tokens[i];
      } else if (const auto b = byte_level::to_bytes(tokens[i])) {
        bytes += *b;
      }
    }
    return out + valid_utf8(bytes);
  }
  // WordPiece decoder: a "##" piece joins the previous token, any other token follows a space.
  const auto& prefix = std::get<WordPieceModel>(model_).options().continuing_subword_prefix;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string token = tokens[i];
    if (i > 0) {
      if (!prefix.empty() && token.compare(0, prefix.size(), prefix) == 0) {
        token.erase(0, prefix.size());
      } else {
        token.insert(0, " ");
      }
    }
    out += clean_up_tokenization(token);
  }
  return out;
}

}  // namespace lockstep::data
