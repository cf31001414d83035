#pragma once
// Resizing a model's token embeddings after tokens were added to its tokenizer, as Hugging Face's
// model.resize_token_embeddings(len(tokenizer)): the input embedding and the output layer (tied:
// one matrix; untied: both) get `n` rows; the first min(old, n) rows keep their values bit for
// bit and rows beyond the old size are initialised as `init` says.
//
// Note [New embedding rows]: random rows (Hugging Face's default, N(0, 0.02)) start far from what
// the model has learned and, with little data for the new tokens, stay near their start. The
// choices here start from what the model knows: zeros; the mean of the existing rows (Hewitt's
// suggestion, now Hugging Face's mean_resizing); a copy of a related token's row; or the mean of
// the rows of a description's tokens ("<dog>" from "a small domesticated animal").

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/data/tokenizer.h"
#include "lockstep/models/gpt_mini.h"

namespace lockstep::models {

enum class EmbeddingInitKind { kZeros, kMean, kCopy, kMeanOf };

struct EmbeddingInit {
  EmbeddingInitKind kind = EmbeddingInitKind::kMean;
  std::vector<int64_t> source_ids;  // kCopy: one id; kMeanOf: the description's ids
};

// Parses --init-new-embeddings: "zeros", "mean", "copy:<token>" (one token of `tokenizer`'s
// vocabulary, spelled as it stores it) or "mean-of:<text>" (the text is encoded; quotes around it
// are dropped). Throws c10::ValueError naming the spec and the fix.
EmbeddingInit parse_embedding_init(const std::string& spec, const data::Tokenizer& tokenizer);

// See the top of this file. Source ids must be old rows (< the old vocabulary size); n >= 1.
// Parameters are resized in place (their identity kept), so make the optimizer afterwards.
void resize_token_embeddings(GptMiniImpl& model, int64_t vocab_size, const EmbeddingInit& init);

}  // namespace lockstep::models
