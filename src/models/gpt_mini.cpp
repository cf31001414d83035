#include "lockstep/models/gpt_mini.h"

#include <cmath>
#include <limits>

#include "lockstep/models/token_embeddings.h"

namespace lockstep::models {
namespace {

// GPT-2's initialisation: N(0, 0.02) weights, zero biases, and the residual projections scaled
// by 1 / sqrt(2 x layers) so the residual stream's variance does not grow with depth.
void init_linear(torch::nn::Linear& l, double stddev) {
  torch::NoGradGuard no_grad;
  l->weight.normal_(0.0, stddev);
  if (l->bias.defined()) l->bias.zero_();
}

// (B, T, C) and (B, T) -> (B, T, C + 1); see Note [Padding through blocks].
torch::Tensor with_mask(const torch::Tensor& x, const torch::Tensor& mask) {
  return torch::cat({x, mask.unsqueeze(-1).to(x.scalar_type())}, -1);
}

}  // namespace

void GptMiniOptions::validate() const {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"vocab_size", vocab_size()},
                                    {"context", context()}, {"d_model", d_model()}, {"heads", heads()},
                                    {"layers", layers()}})
    TORCH_CHECK_VALUE(value >= 1, "gpt-mini: ", name, "=", value, " must be at least 1");
  TORCH_CHECK_VALUE(d_model() % heads() == 0, "gpt-mini: d_model=", d_model(), " is not divisible by heads=", heads(),
                    ": each head takes d_model / heads features");
  TORCH_CHECK_VALUE(pad_id() >= -1 && pad_id() < vocab_size(), "gpt-mini: pad_id=", pad_id(), " is outside [0, ",
                    vocab_size(), ") (-1: no padding token)");
  TORCH_CHECK_VALUE(num_classes() >= 0, "gpt-mini: num_classes=", num_classes(), " must be >= 0 (0: language model)");
}

GptBlockImpl::GptBlockImpl(int64_t d_model, int64_t heads) : heads_(heads) {
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
  attn = register_module("attn", std::make_shared<torch::nn::Module>());
  c_attn = attn->register_module("c_attn", torch::nn::Linear(d_model, 3 * d_model));
  attn_proj = attn->register_module("c_proj", torch::nn::Linear(d_model, d_model));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
  mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  c_fc = mlp->register_module("c_fc", torch::nn::Linear(d_model, 4 * d_model));
  mlp_proj = mlp->register_module("c_proj", torch::nn::Linear(4 * d_model, d_model));
}

torch::Tensor GptBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& key_mask) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hd = C / heads_;
  // See Note [Only real tokens through the linear layers]. real: (N) row indices into (B*T).
  const torch::Tensor real = key_mask.reshape({-1}).nonzero().squeeze(1);
  const bool padded = real.size(0) < B * T;
  const torch::Tensor x_real = padded ? x.reshape({B * T, C}).index_select(0, real) : x.reshape({B * T, C});  // (N, C)
  torch::Tensor qkv = c_attn->forward(ln_1->forward(x_real));                                            // (N, 3C)
  if (padded) qkv = torch::zeros({B * T, 3 * C}, qkv.options()).index_copy(0, real, qkv);
  // q, k, v: (B, heads, T, hd)
  auto split = qkv.view({B, T, 3 * C}).split(C, -1);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, heads_, hd}).transpose(1, 2); };
  const torch::Tensor q = heads(split[0]), k = heads(split[1]), v = heads(split[2]);
  // allowed (B, 1, T, T): key j <= query i, and j is a real token or j == i.
  const auto opts = torch::TensorOptions().dtype(torch::kBool);
  const torch::Tensor causal = torch::ones({T, T}, opts).tril();
  const torch::Tensor self = torch::eye(T, opts);
  const torch::Tensor allowed = causal.logical_and(key_mask.to(torch::kBool).unsqueeze(1)).logical_or(self).unsqueeze(1);
  torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
  att = att.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity()).softmax(-1);
  torch::Tensor y = torch::matmul(att, v).transpose(1, 2).reshape({B * T, C});
  if (padded) y = y.index_select(0, real);
  const torch::Tensor h = x_real + attn_proj->forward(y);
  const torch::Tensor out = h + mlp_proj->forward(torch::gelu(c_fc->forward(ln_2->forward(h))));  // (N, C)
  if (!padded) return out.view({B, T, C});
  return x.reshape({B * T, C}).index_copy(0, real, out.to(x.scalar_type())).view({B, T, C});
}

GptMiniImpl::GptMiniImpl(GptMiniOptions options) : options_(std::move(options)) {
  options_.validate();
  const int64_t C = options_.d_model();
  wte = register_module("wte", torch::nn::Embedding(options_.vocab_size(), C));
  wpe = register_module("wpe", torch::nn::Embedding(options_.context(), C));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < options_.layers(); ++i) h->push_back(GptBlock(C, options_.heads()));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({C})));
  if (!options_.tie_embeddings())
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(C, options_.vocab_size()).bias(false)));
  if (options_.num_classes() > 0)
    score = register_module("score", torch::nn::Linear(torch::nn::LinearOptions(C, options_.num_classes()).bias(false)));

  torch::NoGradGuard no_grad;
  constexpr double kStd = 0.02;
  wte->weight.normal_(0.0, kStd);
  wpe->weight.normal_(0.0, kStd);
  for (const auto& m : *h) {
    auto& b = *m->as<GptBlock>();
    init_linear(b.c_attn, kStd);
    init_linear(b.c_fc, kStd);
    init_linear(b.attn_proj, kStd / std::sqrt(2.0 * static_cast<double>(options_.layers())));
    init_linear(b.mlp_proj, kStd / std::sqrt(2.0 * static_cast<double>(options_.layers())));
  }
  if (lm_head) init_linear(lm_head, kStd);
  if (score) init_linear(score, kStd);
}

torch::Tensor GptMiniImpl::output_embedding_weight() const { return lm_head ? lm_head->weight : wte->weight; }

torch::Tensor GptMiniImpl::forward(torch::Tensor ids) {
  TORCH_CHECK_VALUE(ids.dim() == 2 && !ids.is_floating_point(), "gpt-mini takes token ids: an integer (B, T) tensor, "
                    "not ", ids.scalar_type(), " ", ids.sizes());
  TORCH_CHECK_VALUE(ids.size(1) <= options_.context(), "gpt-mini: a sequence of ", ids.size(1),
                    " tokens is longer than the model's context of ", options_.context(),
                    "; truncate it (--max-length) or build the model with a longer context");
  if (ids.numel() > 0) {
    const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    TORCH_CHECK_VALUE(lo >= 0 && hi < options_.vocab_size(), "gpt-mini: token id ", lo < 0 ? lo : hi,
                      " is outside the vocabulary [0, ", options_.vocab_size(), "); the tokenizer and the model ",
                      "disagree: resize the embeddings (--add-tokens) or use the model's tokenizer");
  }
  return Classifier::forward(ids);
}

std::vector<Block> GptMiniImpl::blocks() {
  std::vector<Block> out;
  auto e = wte.ptr(), p = wpe.ptr();
  const int64_t pad = options_.pad_id();
  out.push_back({"embed", {e, p}, [e, p, pad](const torch::Tensor& ids) {
                   const torch::Tensor pos = torch::arange(ids.size(1), ids.options().dtype(torch::kLong));
                   const torch::Tensor x = e->forward(ids) + p->forward(pos).unsqueeze(0);
                   return with_mask(x, pad >= 0 ? ids.ne(pad) : torch::ones_like(ids, torch::kBool));
                 }});
  for (size_t i = 0; i < h->size(); ++i) {
    auto b = h->ptr<GptBlockImpl>(i);
    out.push_back({"h." + std::to_string(i), {b}, [b](const torch::Tensor& xm) {
                     const int64_t C = xm.size(-1) - 1;
                     const torch::Tensor mask = xm.select(-1, C);
                     return with_mask(b->forward(xm.narrow(-1, 0, C), mask), mask);
                   }});
  }
  auto ln = ln_f.ptr();
  std::shared_ptr<torch::nn::LinearImpl> out_layer, sc;  // null when tied / a language model
  if (lm_head) out_layer = lm_head.ptr();
  if (score) sc = score.ptr();
  // The tied output layer is wte itself, listed again: see Note [Tied weights across stages]. A
  // classifier's head does not use it, so does not list it.
  std::vector<std::shared_ptr<torch::nn::Module>> head{ln};
  if (out_layer) {
    head.push_back(out_layer);
  } else if (!sc) {
    head.push_back(e);
  }
  if (sc) head.push_back(sc);
  const bool packed = options_.packed_logits();
  out.push_back({"head", head, [ln, e, out_layer, sc, packed](const torch::Tensor& xm) {
                   const int64_t C = xm.size(-1) - 1;
                   const torch::Tensor weight = out_layer ? out_layer->weight : e->weight;
                   if (packed && !sc && ln->is_training()) {
                     // (N, V) at the real tokens only: see Note [Only real tokens through the linear layers].
                     const torch::Tensor real = xm.select(-1, C).reshape({-1}).nonzero().squeeze(1);
                     const torch::Tensor x = xm.narrow(-1, 0, C).reshape({-1, C}).index_select(0, real);
                     return torch::nn::functional::linear(ln->forward(x), weight);
                   }
                   const torch::Tensor x = ln->forward(xm.narrow(-1, 0, C));  // (B, T, C)
                   if (sc) {
                     // The last real token of each row: (number of real tokens) - 1, at least 0.
                     const torch::Tensor last = (xm.select(-1, C).sum(1).to(torch::kLong) - 1).clamp_min(0);
                     const torch::Tensor pooled = x.index({torch::arange(x.size(0)), last});  // (B, C)
                     return sc->forward(pooled);
                   }
                   return torch::nn::functional::linear(x, weight);
                 }});
  return out;
}

}  // namespace lockstep::models
