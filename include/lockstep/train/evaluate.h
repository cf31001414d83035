#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cmath>
#include <cstdint>
#include <functional>

#include "lockstep/data/dataset.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/parallel/strategy.h"
#include "lockstep/train/training_data.h"

namespace lockstep::train {

// Logits (B, classes) for a batch of inputs.
using ForwardFunction = std::function<torch::Tensor(const torch::Tensor& input)>;

// The fraction of `dataset` that `forward` classifies correctly (argmax of its logits equals the
// label), with `module` in eval mode (restored to its previous mode after) and without autograd,
// `batch_size` samples at a time. With a group, each rank scores a contiguous share of the data
// set and the counts are summed, so every rank returns the same fraction.
double evaluate(torch::nn::Module& module, const ForwardFunction& forward, const data::Dataset& dataset,
                dist::ProcessGroup* group = nullptr, int64_t batch_size = 200);

// What an evaluation measures: the fraction classified correctly (argmax of the logits (B, classes)
// equals the target (B)), or a language model's mean loss per counted token and its exp.
enum class Metric { kAccuracy, kPerplexity };

// A held-out evaluation: what the metric does not measure is NaN.
struct Evaluation {
  double accuracy = NAN;    // kAccuracy: fraction correct
  double loss = NAN;        // kPerplexity: mean loss per counted target (nats per token)
  double perplexity = NAN;  // exp(loss)
};

// `data` through `forward`, `batch_size` samples at a time, with `module` in eval mode (restored
// after) and without autograd. With a group, each rank takes a contiguous share and the sums are
// reduced, so every rank returns the same figures. kPerplexity weighs each batch's `loss` by the
// data's count() of it.
Evaluation evaluate(torch::nn::Module& module, const ForwardFunction& forward, const TrainingData& data,
                    const parallel::LossFunction& loss, Metric metric, int64_t batch_size,
                    dist::ProcessGroup* group = nullptr);

}  // namespace lockstep::train
