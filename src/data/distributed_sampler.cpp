#include "lockstep/data/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace lockstep::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options)
    : dataset_size_(dataset_size), options_(options) {
  const int64_t world = options_.num_replicas();
  TORCH_CHECK_VALUE(world >= 1, "DistributedSampler: num_replicas=", world, " must be at least 1");
  TORCH_CHECK_VALUE(options_.rank() >= 0 && options_.rank() < world, "DistributedSampler: rank=",
                    options_.rank(), " must be in [0, ", world - 1, "] for num_replicas=", world);
  TORCH_CHECK_VALUE(dataset_size >= 1, "DistributedSampler: the dataset is empty");
  if (options_.drop_last() && dataset_size % world != 0) {
    TORCH_CHECK_VALUE(dataset_size >= world, "DistributedSampler: with drop_last, ", dataset_size,
                      " samples leave none for each of ", world, " ranks");
    num_samples_ = (dataset_size - world + world - 1) / world;  // ceil((size - world) / world)
  } else {
    num_samples_ = (dataset_size + world - 1) / world;
  }
}

torch::Tensor DistributedSampler::indices() const {
  torch::Tensor order;
  if (options_.shuffle()) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(options_.seed() + static_cast<uint64_t>(epoch_));
    order = torch::randperm(dataset_size_, gen, torch::kInt64);
  } else {
    order = torch::arange(dataset_size_, torch::kInt64);
  }
  const int64_t total = total_size();
  if (total > dataset_size_) {
    // Pad by repeating the permutation's head, as often as needed (PyTorch's rule).
    const int64_t repeats = (total + dataset_size_ - 1) / dataset_size_;
    order = order.repeat({repeats}).narrow(0, 0, total);
  } else {
    order = order.narrow(0, 0, total);
  }
  return order.slice(0, options_.rank(), total, options_.num_replicas()).contiguous();
}

}  // namespace lockstep::data
