#include "lockstep/train/training_data.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <utility>

#include "lockstep/data/distributed_sampler.h"

namespace lockstep::train {
namespace {

// "sample 9 has data shaped [9], but sample 2, the first of its batch, has [8]: ..." with the fix.
std::string odd_shape(const std::string& odd, const std::string& first, const std::string& part,
                      c10::IntArrayRef odd_sizes, c10::IntArrayRef first_sizes) {
  return c10::str(odd, " has ", part, " shaped ", odd_sizes, ", but ", first, ", the first of its batch, has ",
                  first_sizes, ": the default collate stacks a batch's samples, so get() must give every sample one ",
                  "shape (pad, crop or resize it there), or override collate() to pad");
}

// What the default collate throws for a sample shaped unlike its batch's first: a ValueError that
// names its position in the batch, and keeps it for get_batch() to name the sample by its index.
class OddSample : public c10::ValueError {
 public:
  OddSample(int64_t position, std::string part, c10::IntArrayRef odd, c10::IntArrayRef first)
      : c10::ValueError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                        "TrainingData::collate: " + odd_shape(c10::str("sample ", position, " of the batch"),
                                                              "sample 0", part, odd, first)),
        position_(position), part_(std::move(part)), odd_(odd.vec()), first_(first.vec()) {}

  // The message again, naming the odd sample and the batch's first by their indices in the split.
  std::string naming(const std::vector<int64_t>& indices) const {
    return "TrainingData: " + odd_shape(c10::str("sample ", indices.at(position_)), c10::str("sample ", indices.at(0)),
                                        part_, odd_, first_);
  }

 private:
  int64_t position_;
  std::string part_;
  std::vector<int64_t> odd_, first_;
};

}  // namespace

Example TrainingData::collate(std::vector<Example> samples) const {
  TORCH_CHECK_VALUE(!samples.empty(), "collate: a batch needs at least one sample");
  // Checked here, not left to torch::stack: its "stack expects each tensor to be equal size" names
  // neither the sample nor its index.
  const Example& first = samples.front();
  for (size_t i = 1; i < samples.size(); ++i) {
    const Example& s = samples[i];
    if (s.data.defined() && first.data.defined() && s.data.sizes() != first.data.sizes())
      throw OddSample(static_cast<int64_t>(i), "data", s.data.sizes(), first.data.sizes());
    if (s.target.defined() && first.target.defined() && s.target.sizes() != first.target.sizes())
      throw OddSample(static_cast<int64_t>(i), "a target", s.target.sizes(), first.target.sizes());
  }
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
  try {
    return collate(std::move(samples));
  } catch (const OddSample& e) {
    C10_THROW_ERROR(ValueError, e.naming(indices));
  }
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
