#include "lockstep/data/added_vocabulary.h"

namespace lockstep::data {

void AddedVocabulary::add(const AddedToken& token, const std::string& normalized_content) {
  by_id_[token.id] = tokens_.size();
  by_content_[token.content] = tokens_.size();
  tokens_.push_back(token);
  if (token.normalized) {
    normalized_.insert(normalized_content, token.id);
  } else {
    raw_.insert(token.content, token.id);
  }
}

const AddedToken* AddedVocabulary::find_id(int64_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::find_content(const std::string& content) const {
  const auto it = by_content_.find(content);
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

int32_t AddedVocabulary::Trie::child(int32_t node, unsigned char byte) const {
  if (node < 0) return root_[byte];
  for (const auto& [b, next] : nodes_[node].children)
    if (b == byte) return next;
  return -1;
}

void AddedVocabulary::Trie::insert(const std::string& key, int64_t id) {
  if (key.empty()) return;  // an empty token matches nothing
  int32_t node = -1;
  for (const char c : key) {
    const auto byte = static_cast<unsigned char>(c);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      if (node < 0) {
        root_[byte] = next;
      } else {
        nodes_[node].children.emplace_back(byte, next);
      }
    }
    node = next;
  }
  nodes_[node].id = id;
}

void AddedVocabulary::Trie::split(std::string_view text, std::vector<TextPiece>& out) const {
  size_t plain_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    int64_t match_id = -1;
    size_t match_end = 0;
    int32_t node = root_[static_cast<unsigned char>(text[pos])];
    for (size_t i = pos + 1; node >= 0; ++i) {
      if (nodes_[node].id >= 0) match_id = nodes_[node].id, match_end = i;
      if (i == text.size()) break;
      node = child(node, static_cast<unsigned char>(text[i]));
    }
    if (match_id < 0) {
      ++pos;
      continue;
    }
    if (pos > plain_start) out.push_back({text.substr(plain_start, pos - plain_start), -1});
    out.push_back({text.substr(pos, match_end - pos), match_id});
    pos = plain_start = match_end;
  }
  if (plain_start < text.size()) out.push_back({text.substr(plain_start), -1});
}

}  // namespace lockstep::data
