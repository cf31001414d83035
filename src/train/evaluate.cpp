#include "lockstep/train/evaluate.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace lockstep::train {

double evaluate(torch::nn::Module& module, const ForwardFunction& forward, const data::Dataset& dataset,
                dist::ProcessGroup* group, int64_t batch_size) {
  TORCH_CHECK_VALUE(dataset.size() > 0, "cannot evaluate on an empty data set (0 samples)");
  TORCH_CHECK_VALUE(batch_size >= 1, "evaluation batch size ", batch_size, " must be at least 1");
  torch::NoGradGuard no_grad;
  const bool was_training = module.is_training();
  module.eval();
  const int64_t rank = group ? group->rank() : 0, world = group ? group->size() : 1;
  const int64_t begin = dataset.size() * rank / world, end = dataset.size() * (rank + 1) / world;
  int64_t correct = 0;
  for (int64_t start = begin; start < end; start += batch_size) {
    auto idx = torch::arange(start, std::min(start + batch_size, end), torch::kInt64);
    auto [x, y] = dataset.batch(idx);
    correct += forward(x).argmax(1).eq(y).sum().item<int64_t>();
  }
  module.train(was_training);
  torch::Tensor counts = torch::tensor({correct}, torch::kInt64);
  if (group) group->all_reduce(counts);
  return static_cast<double>(counts.item<int64_t>()) / static_cast<double>(dataset.size());
}

Evaluation evaluate(torch::nn::Module& module, const ForwardFunction& forward, const TrainingData& data,
                    const parallel::LossFunction& loss, Metric metric, int64_t batch_size, dist::ProcessGroup* group) {
  const int64_t n = data.size();
  TORCH_CHECK_VALUE(n > 0, "cannot evaluate on an empty data set (0 samples)");
  TORCH_CHECK_VALUE(batch_size >= 1, "evaluation batch size ", batch_size, " must be at least 1");
  torch::NoGradGuard no_grad;
  const bool was_training = module.is_training();
  module.eval();
  const int64_t rank = group ? group->rank() : 0, world = group ? group->size() : 1;
  // [summed loss or correct answers, what they are counted in: tokens or samples]
  torch::Tensor sums = torch::zeros({2}, torch::kDouble);
  for (int64_t start = n * rank / world, end = n * (rank + 1) / world; start < end; start += batch_size) {
    std::vector<int64_t> indices;
    for (int64_t i = start; i < std::min(start + batch_size, end); ++i) indices.push_back(i);
    const Example batch = data.get_batch(indices);
    const torch::Tensor out = forward(batch.data).to(torch::kFloat);
    const auto count = static_cast<double>(data.count(batch));
    sums[0] += metric == Metric::kPerplexity ? loss(out, batch.target).item<double>() * count
                                             : static_cast<double>(out.argmax(1).eq(batch.target).sum().item<int64_t>());
    sums[1] += count;
  }
  module.train(was_training);
  if (group) group->all_reduce(sums);
  const double mean = sums[0].item<double>() / sums[1].item<double>();
  Evaluation e;
  if (metric == Metric::kPerplexity) {
    e.loss = mean;
    e.perplexity = std::exp(mean);
  } else {
    e.accuracy = mean;
  }
  return e;
}

}  // namespace lockstep::train
