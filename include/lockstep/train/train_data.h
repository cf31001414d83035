#pragma once
// What the training loop needs of a data set, whatever it holds (images or text).
//
// Note [Training data]
// The loop (trainer.cpp) asks its data for an epoch's micro-batches as lists of sample indices,
// turns each list into a parallel::MicroBatch, weighs it by its share of the step's count, and
// hands the step to the strategy; it evaluates through the data too. Images are cut from
// DistributedSampler's order in --batch-size pieces and counted in samples (the loop of before,
// value for value). Text is cut the same way, or by BucketBatchSampler under a token budget, and
// a language model's micro-batch counts its target tokens, so that a step's loss is the mean over
// its tokens however they fall into micro-batches. The epoch's micro-batches are a function of
// the epoch, so a checkpoint's (epoch, micro-batch) resumes exactly.

#include <torch/nn/module.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/dist/process_group.h"
#include "lockstep/models/classifier.h"
#include "lockstep/parallel/strategy.h"
#include "lockstep/train/evaluate.h"
#include "lockstep/train/options.h"

namespace lockstep::train {

// A held-out evaluation: what does not apply to the task is NaN.
struct Evaluation {
  double accuracy = NAN;    // classification: fraction correct
  double loss = NAN;        // language model: mean next-token loss (nats per token)
  double perplexity = NAN;  // exp(loss)
};

class TrainData {
 public:
  virtual ~TrainData() = default;

  // A freshly initialised model for this data, built as --model says. With `initial_weights`,
  // --init-weights is loaded (and, for text, the embeddings resized to the tokenizer after it).
  virtual std::shared_ptr<models::Classifier> make_model(const TrainOptions& o, dist::ProcessGroup* group,
                                                         bool initial_weights) const = 0;
  // This replica's micro-batches of `epoch`, as indices into the training split; every replica
  // gets the same number.
  virtual std::vector<std::vector<int64_t>> micro_batches(int64_t epoch, int64_t replicas, int64_t replica) = 0;
  // The micro-batch of `indices` (weight unset) and what it counts: samples or target tokens.
  virtual std::pair<parallel::MicroBatch, int64_t> micro_batch(const std::vector<int64_t>& indices) const = 0;
  // The objective of a micro-batch: output and target as micro_batch() and the model give them.
  virtual torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const = 0;
  // The held-out split through `forward`, each rank a share, reduced over `group`.
  virtual Evaluation evaluate(torch::nn::Module& module, const ForwardFunction& forward,
                              dist::ProcessGroup* group) const = 0;
  // Files a checkpoint directory must hold beside the checkpoints (text: tokenizer.json).
  virtual void save_beside_checkpoints(const std::string& dir) const { (void)dir; }
  // Figures of the run for the summary (text: padding, the unigram baseline), as JSON keys.
  virtual std::vector<std::pair<std::string, double>> figures() const { return {}; }
};

// DistributedSampler's order of `size` samples for `replica` of `replicas` in `epoch`, cut into
// micro-batches of `batch_size` (the last may be smaller).
std::vector<std::vector<int64_t>> fixed_micro_batches(int64_t size, int64_t batch_size, uint64_t seed, int64_t epoch,
                                                      int64_t replicas, int64_t replica);

// The data `o` names: Fashion-MNIST or synthetic images (see load_data), fortunes or a text file.
std::unique_ptr<TrainData> make_train_data(const TrainOptions& o, dist::ProcessGroup* group);

}  // namespace lockstep::train
