// Images for the training loop (see Note [Training data]).
#include <torch/torch.h>

#include "lockstep/data/distributed_sampler.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/zoo.h"
#include "lockstep/train/text_data.h"
#include "lockstep/train/train_data.h"

namespace lockstep::train {
namespace {

class ImageData : public TrainData {
 public:
  explicit ImageData(const TrainOptions& o) : splits_(load_data(o)), batch_size_(o.batch_size()), seed_(o.seed()) {}

  std::shared_ptr<models::Classifier> make_model(const TrainOptions& o, dist::ProcessGroup* group,
                                                 bool initial_weights) const override {
    auto model = models::make_model(o.model(), splits_.train.num_classes, o.norm_layer(group));
    if (initial_weights && !o.init_weights().empty()) models::load_state_dict_file(*model, o.init_weights());
    return model;
  }

  std::vector<std::vector<int64_t>> micro_batches(int64_t epoch, int64_t replicas, int64_t replica) override {
    return fixed_micro_batches(splits_.train.size(), batch_size_, seed_, epoch, replicas, replica);
  }

  std::pair<parallel::MicroBatch, int64_t> micro_batch(const std::vector<int64_t>& indices) const override {
    auto [x, y] = splits_.train.batch(torch::tensor(indices, torch::kInt64));  // x (B, C, H, W), y (B)
    return {{x, y}, static_cast<int64_t>(indices.size())};
  }

  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const override {
    return torch::nn::functional::cross_entropy(output, target);
  }

  Evaluation evaluate(torch::nn::Module& module, const ForwardFunction& forward,
                      dist::ProcessGroup* group) const override {
    Evaluation e;
    e.accuracy = train::evaluate(module, forward, splits_.test, group);
    return e;
  }

 private:
  DataSplits splits_;
  int64_t batch_size_;
  uint64_t seed_;
};

}  // namespace

std::vector<std::vector<int64_t>> fixed_micro_batches(int64_t size, int64_t batch_size, uint64_t seed, int64_t epoch,
                                                      int64_t replicas, int64_t replica) {
  data::DistributedSampler sampler(size, data::DistributedSamplerOptions().num_replicas(replicas).rank(replica).seed(seed));
  sampler.set_epoch(epoch);
  const torch::Tensor order = sampler.indices();
  const int64_t n = order.size(0);
  const int64_t* p = order.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < n; i += batch_size) out.emplace_back(p + i, p + std::min(i + batch_size, n));
  return out;
}

std::unique_ptr<TrainData> make_train_data(const TrainOptions& o, dist::ProcessGroup* group) {
  if (o.text()) return make_text_data(o, group);
  return std::make_unique<ImageData>(o);
}

}  // namespace lockstep::train
