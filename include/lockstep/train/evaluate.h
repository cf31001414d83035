#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

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

// What an evaluation measures. kAccuracy: the fraction classified correctly (argmax of the logits
// (B, classes) equals the class-index target (B)); it needs integral (B) targets and at least 2
// classes, and is refused otherwise, naming what it got. kPerplexity: a language model's mean loss
// per counted token and its exp. kNone: the mean loss per sample only (a regression). kAuto:
// kAccuracy where the targets are class indices of logits of 2 or more classes, kNone otherwise
// (an MSE regression's one column); Evaluation::why says which and why.
enum class Metric { kAuto, kAccuracy, kPerplexity, kNone };

// A held-out evaluation: what the metric does not measure is NaN.
struct Evaluation {
  double accuracy = NAN;    // kAccuracy: fraction correct
  double loss = NAN;        // kPerplexity: mean loss per counted target (nats per token); kNone: per sample
  double perplexity = NAN;  // kPerplexity: exp(loss)
  Metric metric = Metric::kAuto;  // what was measured (kAuto: nothing, no held-out split)
  std::string why;                // kAuto's reason for what it measured
};

// `data` through `forward`, `batch_size` samples at a time, with `module` in eval mode (restored
// after) and without autograd. With a group, each rank takes a contiguous share and the sums are
// reduced, so every rank returns the same figures. kPerplexity and kNone weigh each batch's `loss`
// by the data's count() of it. Accuracy's labels must be classes of the logits: a label that is
// not is refused naming its sample (Note [Naming the sample behind a bad label]).
Evaluation evaluate(torch::nn::Module& module, const ForwardFunction& forward, const TrainingData& data,
                    const parallel::LossFunction& loss, Metric metric, int64_t batch_size,
                    dist::ProcessGroup* group = nullptr);

}  // namespace lockstep::train
