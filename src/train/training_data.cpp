#include "lockstep/train/training_data.h"

#include <torch/torch.h>

#include <algorithm>

#include "lockstep/data/distributed_sampler.h"

namespace lockstep::train {

Example TrainingData::collate(std::vector<Example> samples) const {
  TORCH_CHECK_VALUE(!samples.empty(), "collate: a batch needs at least one sample");
  std::vector<torch::Tensor> data, targets;
  data.reserve(samples.size());
  targets.reserve(samples.size());
  for (Example& s : samples) {
    data.push_back(std::move(s.data));
    targets.push_back(std::move(s.target));
  }
  return {torch::stack(data), torch::stack(targets)};
}

Example TrainingData::get_batch(const std::vector<int64_t>& indices) const {
  std::vector<Example> samples;
  samples.reserve(indices.size());
  for (int64_t i : indices) samples.push_back(get(i));
  return collate(std::move(samples));
}

std::vector<std::vector<int64_t>> TrainingData::batches(const EpochBatches& epoch) {
  return sampler_batches(size(), epoch);
}

std::vector<std::vector<int64_t>> sampler_batches(int64_t size, const EpochBatches& epoch) {
  TORCH_CHECK_VALUE(epoch.batch_size >= 1, "batch size ", epoch.batch_size, " must be at least 1");
  data::DistributedSampler sampler(
      size, data::DistributedSamplerOptions().num_replicas(epoch.replicas).rank(epoch.replica).seed(epoch.seed));
  sampler.set_epoch(epoch.epoch);
  const torch::Tensor order = sampler.indices();
  const int64_t n = order.size(0);
  const int64_t* p = order.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < n; i += epoch.batch_size) out.emplace_back(p + i, p + std::min(i + epoch.batch_size, n));
  return out;
}

TensorData::TensorData(torch::Tensor data, torch::Tensor targets) : data_(std::move(data)), targets_(std::move(targets)) {
  TORCH_CHECK_VALUE(data_.defined() && targets_.defined() && data_.dim() >= 1 && targets_.dim() >= 1,
                    "TensorData needs data (N, ...) and targets (N, ...) tensors");
  TORCH_CHECK_VALUE(data_.size(0) == targets_.size(0), "TensorData: data holds ", data_.size(0), " samples but targets ",
                    targets_.size(0), "; give one target per sample");
  TORCH_CHECK_VALUE(data_.size(0) > 0, "TensorData: the split holds no samples");
}

Example TensorData::get(int64_t index) const {
  TORCH_CHECK_INDEX(index >= 0 && index < size(), "sample ", index, " is out of range [0, ", size(), ")");
  return {data_[index], targets_[index]};
}

Example TensorData::get_batch(const std::vector<int64_t>& indices) const {
  const torch::Tensor idx = torch::tensor(indices, torch::kInt64);
  return {data_.index_select(0, idx), targets_.index_select(0, idx)};
}

}  // namespace lockstep::train
