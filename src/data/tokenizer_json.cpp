// Tokenizer <-> Hugging Face's tokenizer.json. The layout (tokenizers 0.13 and later; tokenizers.js
// reads the same): version, truncation, padding, added_tokens [{id, content, single_word, lstrip,
// rstrip, normalized, special}], normalizer, pre_tokenizer, post_processor, decoder, model
// {type, vocab {token: id}, merges ["a b"] for BPE, unk_token ... for WordPiece}.
#include <c10/util/Exception.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/fnv1a.h"
#include "lockstep/data/tokenizer.h"

namespace lockstep::data {

namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Reads tokenizer.json fields, naming the source and the field's path in every error.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  // `field` empty: the whole file.
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    TORCH_CHECK_VALUE(false, source_, field.empty() ? "" : ": " + field, " ", what,
                      "; write tokenizer files with `lockstep tokenize train` or Hugging Face tokenizers' save()");
  }
  const Json& member(const Json& object, const std::string& field, const std::string& key) const {
    if (!object.is_object()) fail(field, "is not a JSON object");
    const auto it = object.find(key);
    if (it == object.end()) fail(field + "." + key, "is missing");
    return *it;
  }
  std::string string(const Json& object, const std::string& field, const std::string& key) const {
    const Json& v = member(object, field, key);
    if (!v.is_string()) fail(field + "." + key, "is not a string: " + v.dump());
    return v.get<std::string>();
  }
  bool boolean(const Json& object, const std::string& field, const std::string& key, bool fallback) const {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) fail(field + "." + key, "is not true or false: " + it->dump());
    return it->get<bool>();
  }
  // The object's "type", which must be one of `allowed` (null is accepted when allowed has "").
  std::string type(const Json& root, const std::string& key, const std::vector<std::string>& allowed) const {
    const Json& v = member(root, "tokenizer", key);
    std::string t = v.is_null() ? "" : string(v, key, "type");
    if (std::find(allowed.begin(), allowed.end(), t) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + (a.empty() ? std::string("null") : a);
      fail(key, "is " + (t.empty() ? std::string("null") : "'" + t + "'") + ", which lockstep does not read here (it reads " + list + ")");
    }
    return t;
  }
  std::vector<std::string> vocab(const Json& model) const {
    const Json& v = member(model, "model", "vocab");
    if (!v.is_object()) fail("model.vocab", "is not an object of token: id");
    std::vector<std::string> by_id(v.size());
    std::vector<bool> seen(v.size(), false);
    for (const auto& [token, id] : v.items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= static_cast<int64_t>(v.size()))
        fail("model.vocab[\"" + token + "\"]", "is " + id.dump() + ", not an id in 0.." + std::to_string(v.size() - 1));
      const auto i = id.get<size_t>();
      if (seen[i]) fail("model.vocab[\"" + token + "\"]", "reuses id " + std::to_string(i));
      seen[i] = true;
      by_id[i] = token;
    }
    return by_id;
  }

 private:
  std::string source_;
};

OrderedJson vocab_json(const std::vector<std::string>& vocab) {
  OrderedJson v = OrderedJson::object();
  for (size_t id = 0; id < vocab.size(); ++id) v[vocab[id]] = id;
  return v;
}

}  // namespace

std::string Tokenizer::to_json() const {
  OrderedJson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = OrderedJson::array();
  std::vector<AddedToken> added = added_.tokens();
  std::sort(added.begin(), added.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  for (const AddedToken& t : added)
    j["added_tokens"].push_back({{"id", t.id}, {"content", t.content}, {"single_word", false}, {"lstrip", false},
                                 {"rstrip", false}, {"normalized", t.normalized}, {"special", t.special}});
  if (const auto* bpe = std::get_if<BpeModel>(&model_)) {
    const OrderedJson byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = byte_level;
    j["post_processor"] = nullptr;
    j["decoder"] = byte_level;
    OrderedJson merges = OrderedJson::array();
    for (const auto& [a, b] : bpe->merges()) merges.push_back(a + " " + b);
    j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                  {"vocab", vocab_json(bpe->vocab())}, {"merges", merges}};
  } else {
    const auto& wp = std::get<WordPieceModel>(model_);
    const auto& n = normalizer_->options();
    j["normalizer"] = {{"type", "BertNormalizer"}, {"clean_text", n.clean_text}, {"handle_chinese_chars", n.handle_chinese_chars},
                       {"strip_accents", n.strip_accents ? OrderedJson(*n.strip_accents) : OrderedJson(nullptr)},
                       {"lowercase", n.lowercase}};
    j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
    j["post_processor"] = nullptr;
    j["decoder"] = {{"type", "WordPiece"}, {"prefix", wp.options().continuing_subword_prefix}, {"cleanup", true}};
    j["model"] = {{"type", "WordPiece"}, {"unk_token", wp.options().unk_token},
                  {"continuing_subword_prefix", wp.options().continuing_subword_prefix},
                  {"max_input_chars_per_word", wp.options().max_input_chars_per_word}, {"vocab", vocab_json(wp.vocab())}};
  }
  try {
    return j.dump(2);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK_VALUE(false, "tokenizer: cannot write JSON (is every added token valid UTF-8?): ", e.what());
  }
}

std::string Tokenizer::fingerprint() const {
  return std::to_string(size()) + " tokens, fnv1a64 " + fnv1a64_hex(to_json());
}

void Tokenizer::save(const std::string& path) const {
  const std::string text = to_json() + "\n";
  write_file_atomic(path, std::vector<char>(text.begin(), text.end()));
}

Tokenizer Tokenizer::load(const std::string& path) {
  const std::vector<char> bytes = read_file(path);
  return from_json(std::string(bytes.begin(), bytes.end()), path);
}

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& source) {
  const Reader r(source);
  Json root;
  try {
    root = Json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number past double's range
    r.fail("", std::string("is not valid JSON: ") + e.what());
  }
  if (!root.is_object()) r.fail("", "is not a JSON object");
  for (const char* unsupported : {"truncation", "padding"})
    if (root.contains(unsupported) && !root[unsupported].is_null())
      r.fail(unsupported, "is set; lockstep's encode does not truncate or pad (set it to null)");
  const Json& model = r.member(root, "tokenizer", "model");
  const std::string model_type = r.string(model, "model", "type");
  if (model_type != "BPE" && model_type != "WordPiece")
    r.fail("model.type", "is '" + model_type + "'; lockstep reads 'BPE' (byte-level) and 'WordPiece'");
  r.type(root, "post_processor", {"", "ByteLevel"});  // ByteLevel's only changes offsets, never ids
  std::optional<Tokenizer> tokenizer;
  if (model_type == "BPE") {
    r.type(root, "normalizer", {""});
    r.type(root, "pre_tokenizer", {"ByteLevel"});
    r.type(root, "decoder", {"ByteLevel"});
    const Json& pre = root["pre_tokenizer"];
    if (r.boolean(pre, "pre_tokenizer", "add_prefix_space", false) || !r.boolean(pre, "pre_tokenizer", "use_regex", true))
      r.fail("pre_tokenizer", "has add_prefix_space true or use_regex false; lockstep reads GPT-2's split only");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "unk_token"})
      if (model.contains(key) && !model[key].is_null()) r.fail(std::string("model.") + key, "is set; lockstep's BPE is byte-level and has none");
    if (r.boolean(model, "model", "byte_fallback", false) || r.boolean(model, "model", "ignore_merges", false))
      r.fail("model", "has byte_fallback or ignore_merges; lockstep reads byte-level BPE without them");
    const Json& m = r.member(model, "model", "merges");
    if (!m.is_array()) r.fail("model.merges", "is not an array");
    std::vector<std::pair<std::string, std::string>> merges;
    for (size_t i = 0; i < m.size(); ++i) {
      const std::string field = "model.merges[" + std::to_string(i) + "]";
      if (m[i].is_string()) {  // "a b", the format before tokenizers 0.20
        const std::string s = m[i].get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) r.fail(field, "is not two tokens 'a b': '" + s + "'");
        merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else if (m[i].is_array() && m[i].size() == 2 && m[i][0].is_string() && m[i][1].is_string()) {
        merges.emplace_back(m[i][0].get<std::string>(), m[i][1].get<std::string>());
      } else {
        r.fail(field, "is neither \"a b\" nor [\"a\", \"b\"]: " + m[i].dump());
      }
    }
    try {
      tokenizer.emplace(BpeModel(r.vocab(model), std::move(merges)));
    } catch (const c10::ValueError& e) {
      r.fail("model", e.what_without_backtrace());
    }
  } else {
    r.type(root, "normalizer", {"BertNormalizer"});
    r.type(root, "pre_tokenizer", {"BertPreTokenizer"});
    r.type(root, "decoder", {"WordPiece"});
    const Json& n = root["normalizer"];
    BertNormalizerOptions no;
    no.clean_text = r.boolean(n, "normalizer", "clean_text", true);
    no.handle_chinese_chars = r.boolean(n, "normalizer", "handle_chinese_chars", true);
    if (n.contains("strip_accents") && !n["strip_accents"].is_null()) no.strip_accents = r.boolean(n, "normalizer", "strip_accents", true);
    no.lowercase = r.boolean(n, "normalizer", "lowercase", true);
    WordPieceOptions wo;
    wo.unk_token = r.string(model, "model", "unk_token");
    wo.continuing_subword_prefix = r.string(model, "model", "continuing_subword_prefix");
    if (r.string(root["decoder"], "decoder", "prefix") != wo.continuing_subword_prefix)
      r.fail("decoder.prefix", "differs from model.continuing_subword_prefix");
    const Json& max_chars = r.member(model, "model", "max_input_chars_per_word");
    if (!max_chars.is_number_integer()) r.fail("model.max_input_chars_per_word", "is not an integer: " + max_chars.dump());
    wo.max_input_chars_per_word = max_chars.get<int64_t>();
    try {
      tokenizer.emplace(WordPieceModel(r.vocab(model), wo), BertNormalizer(no));
    } catch (const c10::ValueError& e) {
      r.fail("model", e.what_without_backtrace());
    }
  }
  const Json& added = r.member(root, "tokenizer", "added_tokens");
  if (!added.is_array()) r.fail("added_tokens", "is not an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    const Json& a = added[i];
    for (const char* flag : {"single_word", "lstrip", "rstrip"})
      if (r.boolean(a, field, flag, false)) r.fail(field + "." + flag, "is true; lockstep matches added tokens exactly (set it to false)");
    const Json& id = r.member(a, field, "id");
    if (!id.is_number_integer() || id.get<int64_t>() < 0) r.fail(field + ".id", "is not a non-negative integer: " + id.dump());
    // Ids are dense: the model's, then the added tokens'. An id past what the file can name would
    // make len(tokenizer), and every embedding resized to it, that large.
    const auto id_bound = tokenizer->model_size() + static_cast<int64_t>(added.size());
    if (id.get<int64_t>() >= id_bound)
      r.fail(field + ".id", "is " + id.dump() + ", past the ids this file can define (the model's " +
                                std::to_string(tokenizer->model_size()) + " and " + std::to_string(added.size()) +
                                " added token(s)): give it an id below " + std::to_string(id_bound));
    AddedToken t{r.string(a, field, "content"), id.get<int64_t>(), r.boolean(a, field, "special", false), true};
    t.normalized = r.boolean(a, field, "normalized", !t.special);
    if (t.content.empty() || tokenizer->added_.find_content(t.content) || tokenizer->added_.find_id(t.id))
      r.fail(field, "repeats the content or id of an earlier added token, or is empty");
    const int64_t model_id = std::visit([&](const auto& m) { return m.token_to_id(t.content); }, tokenizer->model_);
    if (t.id < tokenizer->model_size() && model_id != t.id)
      r.fail(field + ".id", "is " + std::to_string(t.id) + ", a model token's id, but the model calls '" + t.content + "' " + std::to_string(model_id));
    tokenizer->added_.add(t, tokenizer->normalizer_ ? tokenizer->normalizer_->normalize(t.content) : t.content);
  }
  return std::move(*tokenizer);
}

}  // namespace lockstep::data
