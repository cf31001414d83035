#pragma once
// Text for the training loop: --data fortunes or --data text:FILE, --model gpt-mini.
//
// Note [Text training]
// The corpus is read in entries (lines, or '%'-separated fortunes; empty entries are skipped),
// each with its category (the file it came from). Every 20th entry (indices 19, 39, ...) is held
// out for evaluation, so the held-out split spans every category; --limit takes the first N of
// the rest, and reading stops there (at the first held-out entry when none came before): the
// held-out split is then the held-out entries read up to that point, so --limit bounds what a
// run reads of a file of any size or a stream. An entry longer than data::kMaxTextEntryBytes
// (16 MiB) is refused naming the file and the line. The tokenizer is --tokenizer's, else the one
// saved beside the checkpoints a run resumes from, else a byte-level BPE of --vocab-size trained
// on the training split at start (every rank trains the same one, deterministically); it gets an
// end-of-text token (<|endoftext|>, or BERT's [SEP]) and a padding token (<pad>, or [PAD]) when it
// lacks them, then --add-tokens' tokens, and the model's embeddings grow to its size (Note [New
// embedding rows]). A checkpoint directory holds the tokenizer as tokenizer.json, and each
// checkpoint its fingerprint (Note [Tokenizer fingerprint]).
// - lm: a sequence is <|endoftext|> entry <|endoftext|>; the model reads its first T tokens and
//   predicts the next T (T <= --max-length, longer entries truncated); padding has target -100,
//   which the loss ignores (so has a <pad> written in the text: the model treats it as padding),
//   and a micro-batch counts its target tokens. In training the model computes its logits at the
//   real tokens only (Note [Only real tokens through the linear layers]). Evaluation: the mean
//   next-token loss over the held-out tokens and its exp, the perplexity.
// - classify: the sequence is entry <|endoftext|> (truncated), the target its category; the model
//   reads the last real token. Evaluation: accuracy.
// Batches are --batch-size sequences cut from DistributedSampler's order, or, with --max-tokens,
// BucketBatchSampler's length-bucketed batches (Note [Bucketed batches]); either way every replica
// has the same number per epoch.

#include <cstdint>
#include <vector>

namespace lockstep::train {

// The perplexity of `test` under the add-one smoothed unigram distribution of `train` over a
// vocabulary of `vocab_size` ids: exp(-mean over test tokens of log((count + 1) / (N + V))).
// The baseline a language model must beat.
double unigram_perplexity(const std::vector<int64_t>& train, const std::vector<int64_t>& test, int64_t vocab_size);

// The padding fraction of batches of sequences of `lengths`, each truncated to `max_length`:
// 1 - real / padded tokens, each batch padded to its longest. 0 for no batches.
double padding_fraction(const std::vector<std::vector<int64_t>>& batches, const std::vector<int64_t>& lengths,
                        int64_t max_length);

}  // namespace lockstep::train
