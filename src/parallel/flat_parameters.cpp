#include "lockstep/parallel/flat_parameters.h"

#include <torch/torch.h>

#include <algorithm>

namespace lockstep::parallel {

namespace {

std::vector<std::pair<std::string, torch::Tensor>> named_parameters(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : module.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

}  // namespace

FlatParameters::FlatParameters(torch::nn::Module& module, int64_t world_size, int64_t rank)
    : FlatParameters(named_parameters(module), world_size, rank) {}

FlatParameters::FlatParameters(const std::vector<std::pair<std::string, torch::Tensor>>& named, int64_t world_size,
                               int64_t rank)
    : world_size_(world_size), rank_(rank) {
  TORCH_CHECK_VALUE(world_size >= 1 && rank >= 0 && rank < world_size, "FlatParameters: rank ", rank,
                    " is not in a group of ", world_size);
  for (const auto& [name, p] : named) {
    TORCH_CHECK_VALUE(p.scalar_type() == torch::kFloat && p.requires_grad(), "rank ", rank, ": parameter '",
                      name, "' is ", p.scalar_type(), (p.requires_grad() ? "" : " without requires_grad"),
                      "; sharding needs fp32 parameters that all train (build the model in fp32, unfrozen)");
    offsets_.push_back(numel_);
    numel_ += p.numel();
    params_.push_back(p);
    names_.push_back(name);
  }
  TORCH_CHECK_VALUE(numel_ > 0, "rank ", rank, ": the model has no parameters to shard");
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
