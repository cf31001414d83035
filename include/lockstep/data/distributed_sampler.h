#pragma once

#include <torch/arg.h>
#include <torch/types.h>

namespace lockstep::data {

struct DistributedSamplerOptions {
  TORCH_ARG(int64_t, num_replicas) = 1;  // world size
  TORCH_ARG(int64_t, rank) = 0;
  TORCH_ARG(bool, shuffle) = true;
  TORCH_ARG(uint64_t, seed) = 0;         // same on every rank; the epoch is added to it
  TORCH_ARG(bool, drop_last) = false;
};

// torch.utils.data.DistributedSampler's semantics: each epoch, a permutation of [0, size) seeded
// with seed + epoch (the same on every rank) is padded by repeating its head (or truncated, with
// drop_last) to a multiple of num_replicas, and rank r takes positions r, r + num_replicas, ...
// With num_replicas 1 it is a seeded per-epoch shuffle, so one process with batch 2B visits, step by
// step, exactly the samples two ranks with batch B visit together.
class DistributedSampler {
 public:
  explicit DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options = {});

  // Changes the shuffle; call before each epoch, as in PyTorch.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  // This rank's sample indices for the current epoch: int64, shape (num_samples()).
  torch::Tensor indices() const;

  int64_t num_samples() const { return num_samples_; }         // per rank
  int64_t total_size() const { return num_samples_ * options_.num_replicas(); }
  const DistributedSamplerOptions& options() const { return options_; }

 private:
  int64_t dataset_size_;
  DistributedSamplerOptions options_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
};

}  // namespace lockstep::data
