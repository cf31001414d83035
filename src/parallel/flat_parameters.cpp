#include "lockstep/parallel/flat_parameters.h"

#include <torch/torch.h>

#include <algorithm>

namespace lockstep::parallel {

std::vector<IndexedParameter> trainable_parameters(const torch::nn::Module& module) {
  std::vector<IndexedParameter> out;
  const auto named = module.named_parameters();
  for (size_t i = 0; i < named.size(); ++i)
    if (named[i].value().requires_grad())
      out.push_back({named[i].key(), named[i].value(), static_cast<int64_t>(i)});
  return out;
}

int64_t frozen_parameter_bytes(const torch::nn::Module& module) {
  int64_t bytes = 0;
  for (const auto& p : module.parameters())
    if (!p.requires_grad()) bytes += p.numel() * static_cast<int64_t>(p.element_size());
  return bytes;
}

FlatParameters::FlatParameters(torch::nn::Module& module, int64_t world_size, int64_t rank)
    : FlatParameters(trainable_parameters(module), static_cast<int64_t>(module.parameters().size()), world_size,
                     rank) {}

FlatParameters::FlatParameters(const std::vector<IndexedParameter>& params, int64_t model_param_count,
                               int64_t world_size, int64_t rank)
    : world_size_(world_size), rank_(rank), model_param_count_(model_param_count) {
  TORCH_CHECK_VALUE(world_size >= 1 && rank >= 0 && rank < world_size, "FlatParameters: rank ", rank,
                    " is not in a group of ", world_size);
  for (const IndexedParameter& p : params) {
    TORCH_CHECK_VALUE(p.tensor.requires_grad() && p.index >= 0 && p.index < model_param_count,
                      "FlatParameters: parameter '", p.name, "' (model index ", p.index, " of ", model_param_count,
                      ") is frozen or not the model's: only trainable parameters are flattened");
    TORCH_CHECK_VALUE(p.tensor.scalar_type() == torch::kFloat, "rank ", rank, ": parameter '", p.name, "' is ",
                      p.tensor.scalar_type(), "; sharding needs fp32 trainable parameters (build the model in fp32, ",
                      "or freeze it with requires_grad_(false): frozen parameters stay whole in any dtype)");
    offsets_.push_back(numel_);
    numel_ += p.tensor.numel();
    params_.push_back(p.tensor);
    names_.push_back(p.name);
    indices_.push_back(p.index);
  }
  TORCH_CHECK_VALUE(numel_ > 0, "rank ", rank, ": the model has no trainable parameters to shard (all ",
                    model_param_count, " have requires_grad false); unfreeze the ones to train");
  shard_numel_ = (numel_ + world_size - 1) / world_size;
  torch::NoGradGuard no_grad;
  flat_ = torch::zeros({padded_numel()}, params_[0].options().requires_grad(false));
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i];
    torch::Tensor range = flat_.narrow(0, offsets_[i], p.numel());
    range.copy_(p.detach().reshape({-1}));
    p.set_data(range.view(p.sizes()));
  }
  // detach(): a plain alias, not an autograd view, so optimizers may detach_() its .grad.
  shard_ = flat_.narrow(0, shard_begin(rank), shard_numel_).detach();
}

std::vector<int64_t> FlatParameters::shard_counts(int64_t begin, int64_t end) const {
  std::vector<int64_t> counts(world_size_);
  for (int64_t r = 0; r < world_size_; ++r)
    counts[r] = std::max<int64_t>(0, std::min(end, shard_begin(r) + shard_numel_) - std::max(begin, shard_begin(r)));
  return counts;
}

std::vector<torch::Tensor> FlatParameters::unflatten(const torch::Tensor& full) const {
  TORCH_CHECK(full.numel() == padded_numel(), "unflatten: ", full.numel(), " elements, expected ", padded_numel());
  const torch::Tensor flat = full.reshape({-1});
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i)
    out.push_back(flat.narrow(0, offsets_[i], params_[i].numel()).view(params_[i].sizes()).clone());
  return out;
}

torch::Tensor FlatParameters::flatten(const std::vector<torch::Tensor>& per_param, const std::string& what) const {
  TORCH_CHECK(per_param.size() == params_.size(), what, " has ", per_param.size(), " tensors but the model has ",
              params_.size(), " parameters");
  torch::Tensor out = torch::zeros({padded_numel()}, per_param[0].options());
  for (size_t i = 0; i < params_.size(); ++i) {
    TORCH_CHECK(per_param[i].sizes() == params_[i].sizes(), what, ": the tensor for parameter ", i, " ('", names_[i],
                "') has shape ", per_param[i].sizes(), " but the parameter has shape ", params_[i].sizes(),
                " (was it saved from a different model?)");
    out.narrow(0, offsets_[i], params_[i].numel()).copy_(per_param[i].reshape({-1}));
  }
  return out;
}

}  // namespace lockstep::parallel
