#pragma once
// gpt-mini: a small decoder-only transformer (GPT-2's layout: pre-LayerNorm blocks of causal
// self-attention and a GELU MLP, learned positions, the output layer tied to the token embedding)
// for language modelling and sequence classification on CPU. The defaults (4 layers, 4 heads,
// d_model 256, context 128) train on two cores in minutes.
//
// State-dict keys (tests/python/gpt_mini.py is the same module in plain PyTorch):
//   wte.weight (V, C), wpe.weight (T_max, C),
//   h.<i>.ln_1.{weight,bias}, h.<i>.attn.c_attn.{weight,bias} (3C, C), h.<i>.attn.c_proj.{weight,bias},
//   h.<i>.ln_2.{weight,bias}, h.<i>.mlp.c_fc.{weight,bias} (4C, C), h.<i>.mlp.c_proj.{weight,bias},
//   ln_f.{weight,bias}, lm_head.weight (V, C) only when untied, score.weight (classes, C) only
//   for classification. Linear weights are nn.Linear's (out, in), not GPT-2's Conv1D (in, out).
//
// Note [Padding through blocks]
// A block is a function of one tensor (Note [Model blocks]), yet every attention layer needs to
// know which positions are padding. The embedding block therefore appends the key mask as one
// extra feature: blocks pass (B, T, C + 1) with [..., C] = 1 for a real token and 0 for padding,
// and each transformer block works on [..., :C] and carries the mask through unchanged. Pipeline
// stages send it along with the activations and activation checkpointing recomputes from it; no
// block reads state outside its input. A query attends to the real keys at or before its
// position, and always to itself, so a row is never all masked (left padding stays finite).
//
// Note [Only real tokens through the linear layers]
// Text batches are padded to their longest row (half or more of a fixed batch of fortunes is
// padding), yet every layer but attention works on each token alone. A block therefore gathers
// the real tokens into an (N, C) matrix, runs LayerNorm, the projections and the MLP on them only,
// and scatters back into (B, T, C) just for attention's scores (padding rows of q, k and v are
// zero; no real query sees them). Padding positions carry the block's input through unchanged, so
// the outputs at real positions are exactly those of the padded computation (the Python module
// tests/python/gpt_mini.py), and the outputs at padding positions are not the Python module's:
// they mean nothing either way. With packed_logits the output layer, the largest product (V x C
// per token), runs on the real tokens too, and the loss's log-softmax holds (N, V), not (B, T, V).
// Time and activation memory of everything but attention scale with the real tokens.

#include <torch/arg.h>
#include <torch/nn.h>

#include <cstdint>

#include "lockstep/models/classifier.h"

namespace lockstep::models {

struct EmbeddingInit;  // token_embeddings.h

struct GptMiniOptions {
  explicit GptMiniOptions(int64_t vocab_size) : vocab_size_(vocab_size) {}
  TORCH_ARG(int64_t, vocab_size);
  TORCH_ARG(int64_t, context) = 128;  // longest sequence, tokens (rows of wpe)
  TORCH_ARG(int64_t, d_model) = 256;
  TORCH_ARG(int64_t, heads) = 4;
  TORCH_ARG(int64_t, layers) = 4;
  TORCH_ARG(int64_t, pad_id) = -1;       // token id whose positions are padding; -1: none
  TORCH_ARG(int64_t, num_classes) = 0;   // 0: a language model (logits over the vocabulary)
  TORCH_ARG(bool, tie_embeddings) = true;
  // In training mode, a language model returns the logits of its real tokens only, (N, V) in
  // row-major (B, T) order: all a next-token loss reads (lockstep train's text runs set it; see
  // Note [Only real tokens through the linear layers]). Evaluation mode always returns (B, T, V).
  TORCH_ARG(bool, packed_logits) = false;

 public:
  // Throws c10::ValueError naming the value: sizes >= 1, d_model divisible by heads.
  void validate() const;
};

class GptMiniImpl : public Classifier {
 public:
  explicit GptMiniImpl(GptMiniOptions options);

  // ids: int64 (B, T), T <= context -> language model: logits (B, T, vocab_size), or (real
  // tokens, vocab_size) in training mode with packed_logits; classifier: logits (B, num_classes)
  // from the last real token (Hugging Face's GPT2ForSequenceClassification). Throws
  // c10::ValueError for T > context or an id outside the vocabulary.
  torch::Tensor forward(torch::Tensor ids) override;

  // "embed" (wte, wpe), "h.0" .. "h.<layers-1>", "head" (ln_f, the output layer: lm_head, or
  // wte again when tied, and a classifier's score); see Note [Model blocks], Note [Padding
  // through blocks] and, for wte in two blocks, Note [Tied weights across stages].
  std::vector<Block> blocks() override;

  const GptMiniOptions& options() const { return options_; }
  // The output layer's weight (V, C): wte.weight when tied, lm_head.weight otherwise.
  torch::Tensor output_embedding_weight() const;

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr}, score{nullptr};  // lm_head: untied only; score: classifier only

 private:
  friend void resize_token_embeddings(GptMiniImpl& model, int64_t vocab_size, const EmbeddingInit& init);
  GptMiniOptions options_;
};
TORCH_MODULE(GptMini);

// One transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)), on (B, T, C) with a (B, T)
// key mask (1: real token).
class GptBlockImpl : public torch::nn::Module {
 public:
  GptBlockImpl(int64_t d_model, int64_t heads);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& key_mask);

  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  std::shared_ptr<torch::nn::Module> attn, mlp;  // attn: c_attn, c_proj; mlp: c_fc, c_proj
  torch::nn::Linear c_attn{nullptr}, attn_proj{nullptr}, c_fc{nullptr}, mlp_proj{nullptr};

 private:
  int64_t heads_;
};
TORCH_MODULE(GptBlock);

}  // namespace lockstep::models
