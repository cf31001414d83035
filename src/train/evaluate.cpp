#include "lockstep/train/evaluate.h"

#include <torch/torch.h>

#include <algorithm>

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

}  // namespace lockstep::train
