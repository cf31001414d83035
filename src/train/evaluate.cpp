#include "lockstep/train/evaluate.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "class_labels.h"

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

namespace {

// Why accuracy cannot score `output` against `target`, or "" when it can: it needs class-index
// targets (integral, (B)) and logits (B, classes) of at least 2 classes.
std::string accuracy_mismatch(const torch::Tensor& output, const torch::Tensor& target) {
  if (!c10::isIntegralType(target.scalar_type(), /*includeBool=*/false))
    return c10::str("the targets are ", target.scalar_type(), ", not class indices (integers)");
  if (target.dim() != 1) return c10::str("the targets are shaped ", target.sizes(), ", not (B) class indices");
  if (output.dim() != 2 || output.size(0) != target.size(0))
    return c10::str("the model's output is shaped ", output.sizes(), ", not (", target.size(0), ", classes)");
  if (output.size(1) < 2) return "the model's output has one column, whose argmax is always class 0";
  return "";
}

// The batch's correct answers; `who`: "rank 1: " or "" in errors.
double correct_answers(const torch::Tensor& out, const Example& batch, const std::vector<int64_t>& indices,
                       const std::string& who) {
  const std::string why = accuracy_mismatch(out, batch.target);
  TORCH_CHECK_VALUE(why.empty(), who, "the accuracy metric compares the argmax of the model's output with ",
                    "class-index targets, but ", why, ": measure the held-out loss only with Metric::kNone (a ",
                    "regression), or give the split class-index targets");
  check_labels(batch.target, out.size(1), indices, "held-out", who);  // an answer no class can give
  return static_cast<double>(out.argmax(1).eq(batch.target).sum().item<int64_t>());
}

// The batch's loss, naming the sample when a label is why it fails (Note [Naming the sample
// behind a bad label]).
double batch_loss(const parallel::LossFunction& loss, const torch::Tensor& out, const Example& batch,
                  const std::vector<int64_t>& indices, const std::string& who) {
  try {
    return loss(out, batch.target).item<double>();
  } catch (const c10::Error& e) {
    if (out.dim() == 2)
      check_labels(batch.target, out.size(1), indices, "held-out", who,
                   c10::str(" (the loss said: ", e.what_without_backtrace(), ")"));
    throw;
  }
}

}  // namespace

Evaluation evaluate(torch::nn::Module& module, const ForwardFunction& forward, const TrainingData& data,
                    const parallel::LossFunction& loss, Metric metric, int64_t batch_size, dist::ProcessGroup* group) {
  const int64_t n = data.size();
  TORCH_CHECK_VALUE(n > 0, "cannot evaluate on an empty data set (0 samples)");
  TORCH_CHECK_VALUE(batch_size >= 1, "evaluation batch size ", batch_size, " must be at least 1");
  torch::NoGradGuard no_grad;
  const bool was_training = module.is_training();
  module.eval();
  const int64_t rank = group ? group->rank() : 0, world = group ? group->size() : 1;
  const std::string who = group ? c10::str("rank ", rank, ": ") : "";
  Metric scored = metric;  // kAuto: decided on this rank's first batch
  std::string why = "the held-out targets are not class indices of 2 or more classes";
  double value = 0.0, count = 0.0;  // summed loss or correct answers; what they are counted in (tokens or samples)
  for (int64_t start = n * rank / world, end = n * (rank + 1) / world; start < end; start += batch_size) {
    std::vector<int64_t> indices;
    for (int64_t i = start; i < std::min(start + batch_size, end); ++i) indices.push_back(i);
    const Example batch = data.get_batch(indices);
    const torch::Tensor out = forward(batch.data).to(torch::kFloat);
    if (scored == Metric::kAuto) {
      why = accuracy_mismatch(out, batch.target);
      scored = why.empty() ? Metric::kAccuracy : Metric::kNone;
      if (why.empty()) why = c10::str("the targets are class indices of ", out.size(1), " classes");
    }
    const auto counted = static_cast<double>(data.count(batch));
    value += scored == Metric::kAccuracy ? correct_answers(out, batch, indices, who)
                                         : batch_loss(loss, out, batch, indices, who) * counted;
    count += counted;
  }
  module.train(was_training);
  // [value, count, ranks that scored accuracy, ranks that scored the loss]
  torch::Tensor sums = torch::tensor({value, count, scored == Metric::kAccuracy ? 1.0 : 0.0,
                                      scored == Metric::kNone || scored == Metric::kPerplexity ? 1.0 : 0.0},
                                     torch::kDouble);
  if (group) group->all_reduce(sums);
  const double* s = sums.data_ptr<double>();
  TORCH_CHECK_VALUE(s[2] == 0.0 || s[3] == 0.0, who, "the held-out split was scored by accuracy on ", s[2],
                    " ranks and by the loss on ", s[3], ": their targets or the model's outputs differ in type or ",
                    "shape; choose the metric");
  const double mean = s[0] / s[1];
  Evaluation e;
  e.metric = s[2] > 0.0 ? Metric::kAccuracy : metric == Metric::kPerplexity ? Metric::kPerplexity : Metric::kNone;
  if (metric == Metric::kAuto) e.why = why;
  if (e.metric == Metric::kAccuracy) {
    e.accuracy = mean;
  } else {
    e.loss = mean;
    if (e.metric == Metric::kPerplexity) e.perplexity = std::exp(mean);
  }
  return e;
}

}  // namespace lockstep::train
