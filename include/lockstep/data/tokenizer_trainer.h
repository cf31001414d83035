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

// `corpus`: one entry per element; `corpus_name` names it in errors (e.g. the file it came from).
Tokenizer train_tokenizer(const std::vector<std::string>& corpus, const TokenizerTrainerOptions& options,
                          const std::string& corpus_name = "the corpus");

}  // namespace lockstep::data
