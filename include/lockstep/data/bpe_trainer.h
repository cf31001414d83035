#pragma once
// Learns byte-pair merges from word counts (Hugging Face's BpeTrainer, which WordPieceTrainer also
// uses): start from an alphabet of single symbols, repeatedly merge the adjacent pair that occurs
// most often in the corpus (ties: the pair whose tokens were created first), until the vocabulary
// has `vocab_size` tokens or no pair occurs `min_frequency` times.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::data {

struct BpeTrainerInput {
  // The words' initial symbols (e.g. byte-level characters, or "h" "##e" "##y" for WordPiece).
  std::vector<std::string> symbols;
  // Each distinct word as indices into `symbols` (4 bytes a symbol, where a string per symbol
  // took 32: a word of millions of bytes), with how often it occurs.
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words;
  std::vector<std::string> special_tokens;  // ids 0.., in this order
  std::vector<std::string> alphabet;        // the next ids, whether or not the corpus uses them
  // Prefix marking a continuation symbol ("##" for WordPiece, "" for BPE): merging "a" with "##b"
  // makes "ab", and "##a" with "##b" makes "##ab".
  std::string continuing_subword_prefix;
  int64_t vocab_size = 0;
  int64_t min_frequency = 0;  // pairs seen fewer times are not merged (Hugging Face's default: 0)
};

struct BpeTrainerResult {
  std::vector<std::string> vocab;                            // by id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
};

BpeTrainerResult train_bpe(const BpeTrainerInput& input);

}  // namespace lockstep::data
