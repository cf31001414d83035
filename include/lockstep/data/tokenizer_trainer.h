#pragma once
// Trains a Tokenizer on a corpus, as Hugging Face's BpeTrainer (byte-level alphabet) and
// WordPieceTrainer do: count the corpus's words after normalization and pre-tokenization, learn
// merges (bpe_trainer.h) up to the vocabulary size, and register the special tokens as added
// tokens (special, never normalized).

#include <torch/arg.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/data/tokenizer.h"

namespace lockstep::data {

struct TokenizerTrainerOptions {
  TORCH_ARG(TokenizerModelKind, model) = TokenizerModelKind::kBpe;
  // Model tokens plus special tokens. BPE needs at least 256 + the special tokens (its alphabet is
  // every byte); WordPiece needs the special tokens plus every character of the corpus.
  TORCH_ARG(int64_t, vocab_size) = 8000;
  // Ids 0.. in this order. Unset: GPT-2's <|endoftext|> for BPE; BERT's [PAD] [UNK] [CLS] [SEP]
  // [MASK] for WordPiece (whose list must hold its unknown token, [UNK]).
  TORCH_ARG(std::optional<std::vector<std::string>>, special_tokens) = std::nullopt;
  TORCH_ARG(int64_t, min_frequency) = 0;  // pairs seen fewer times are never merged
};

// Note [Long words in training]
// Learning merges costs, per merge, the length of every distinct word holding its pair, so one
// word of 50 MB (a run of one character, base64, a line of a binary file) took minutes and
// gigabytes. Training counts such a word as consecutive pieces of at most this many bytes (cut
// on character boundaries), which cost what ordinary words cost; it only forgoes merges across
// the cuts, so no token is longer than this. Encoding has no such limit (Note [BPE merges in n log
// n]): a trained tokenizer encodes a long word as Hugging Face's does.
constexpr size_t kMaxTrainingWordBytes = 1000;

// `corpus`: one entry per element; `corpus_name` names it in errors (e.g. the file it came from).
Tokenizer train_tokenizer(const std::vector<std::string>& corpus, const TokenizerTrainerOptions& options,
                          const std::string& corpus_name = "the corpus");

}  // namespace lockstep::data
