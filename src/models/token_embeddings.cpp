#include "lockstep/models/token_embeddings.h"

#include <c10/util/string_view.h>
#include <torch/torch.h>

namespace lockstep::models {
namespace {

constexpr const char* kChoices = "choose zeros, mean, copy:<token> or mean-of:\"<text>\"";

// (old, C) -> (n, C): the old rows first, then the new rows as `init` says.
torch::Tensor resized(const torch::Tensor& old, int64_t n, const EmbeddingInit& init) {
  const int64_t keep = std::min(old.size(0), n);
  torch::Tensor out = torch::empty({n, old.size(1)}, old.options());
  out.narrow(0, 0, keep).copy_(old.narrow(0, 0, keep));
  if (n <= keep) return out;
  torch::Tensor fresh = out.narrow(0, keep, n - keep);
  switch (init.kind) {
    case EmbeddingInitKind::kZeros:
      fresh.zero_();
      break;
    case EmbeddingInitKind::kMean:
      fresh.copy_(old.mean(0, /*keepdim=*/true).expand_as(fresh));
      break;
    case EmbeddingInitKind::kCopy:
    case EmbeddingInitKind::kMeanOf: {
      const torch::Tensor ids = torch::tensor(init.source_ids, torch::kLong);
      fresh.copy_(old.index_select(0, ids).mean(0, /*keepdim=*/true).expand_as(fresh));
      break;
    }
  }
  return out;
}

}  // namespace

EmbeddingInit parse_embedding_init(const std::string& spec, const data::Tokenizer& tokenizer) {
  if (spec == "zeros") return {EmbeddingInitKind::kZeros, {}};
  if (spec == "mean") return {EmbeddingInitKind::kMean, {}};
  if (c10::string_view(spec).starts_with("copy:")) {
    const std::string token = spec.substr(5);
    const int64_t id = tokenizer.token_to_id(token);
    TORCH_CHECK_VALUE(id >= 0, "--init-new-embeddings '", spec, "': the tokenizer has no token '", token,
                      "'; give a token of its vocabulary as it stores it (byte-level BPE spells a leading space "
                      "as 'Ġ'), or use mean-of:\"<text>\"");
    return {EmbeddingInitKind::kCopy, {id}};
  }
  if (c10::string_view(spec).starts_with("mean-of:")) {
    std::string text = spec.substr(8);
    if (text.size() >= 2 && text.front() == '"' && text.back() == '"') text = text.substr(1, text.size() - 2);
    std::vector<int64_t> ids = tokenizer.encode(text);
    TORCH_CHECK_VALUE(!ids.empty(), "--init-new-embeddings '", spec, "': the text encodes to no tokens; give a ",
                      "description of the new tokens, e.g. mean-of:\"a small dog\"");
    return {EmbeddingInitKind::kMeanOf, std::move(ids)};
  }
  TORCH_CHECK_VALUE(false, "--init-new-embeddings '", spec, "' is not an initialiser: ", kChoices);
  return {};
}

void resize_token_embeddings(GptMiniImpl& model, int64_t vocab_size, const EmbeddingInit& init) {
  const int64_t old = model.options_.vocab_size();
  TORCH_CHECK_VALUE(vocab_size >= 1, "resize_token_embeddings: vocab_size=", vocab_size, " must be at least 1");
  for (int64_t id : init.source_ids)
    TORCH_CHECK_VALUE(id >= 0 && id < old, "resize_token_embeddings: token id ", id, " to initialise from is not one ",
                      "of the model's ", old, " existing rows; initialise from tokens the model already knows");
  TORCH_CHECK_VALUE(model.options_.pad_id() < vocab_size, "resize_token_embeddings: vocab_size=", vocab_size,
                    " would drop the padding token ", model.options_.pad_id());
  torch::NoGradGuard no_grad;
  // set_data keeps each parameter's identity, so its name in the state dict stays.
  model.wte->weight.set_data(resized(model.wte->weight, vocab_size, init));
  model.wte->options.num_embeddings(vocab_size);
  if (model.lm_head) {
    model.lm_head->weight.set_data(resized(model.lm_head->weight, vocab_size, init));
    model.lm_head->options.out_features(vocab_size);
  }
  model.options_.vocab_size(vocab_size);
}

}  // namespace lockstep::models
