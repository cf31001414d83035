#pragma once
// What the training loop needs of a data set: yours, or one of `lockstep train`'s built-in ones.
//
// Note [Training data]
// The loop (trainer.cpp) asks its data for an epoch's batches as lists of sample indices, turns
// each list into a parallel::MicroBatch through get_batch(), weighs it by its share of the step's
// count(), and hands the step to the strategy; the held-out split is evaluated the same way. The
// default order is DistributedSampler's, cut into batch_size pieces, counted in samples. Text cuts
// its batches by a token budget instead (BucketBatchSampler), and a language model's batch counts
// its target tokens, so that a step's loss is the mean over its tokens however they fall into
// micro-batches. An epoch's batches are a function of the epoch, so a checkpoint's (epoch,
// micro-batch) resumes exactly.

#include <torch/data/example.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::train {

// One sample, or a batch of them: LibTorch's {data, target} pair.
using Example = torch::data::Example<>;

// Which of its replica's batches an epoch gives one replica of the model.
struct EpochBatches {
  int64_t epoch = 0;
  int64_t replicas = 1;     // data-parallel replicas of the run
  int64_t replica = 0;      // this one
  int64_t batch_size = 1;   // samples per batch and replica
  uint64_t seed = 0;        // of the shuffle
};

// A training (or held-out) split that the user implements the way LibTorch's
// torch::data::datasets::Dataset is implemented: sized, indexable, with a collate step. Only
// size() and get() are required; the rest have the defaults a PyTorch user expects. With loader
// workers (TrainerOptions::loader) get() and get_batch() run on several threads at once, so they
// must not change the object (see Note [Background loading]).
class TrainingData {
 public:
  virtual ~TrainingData() = default;

  // Samples in the split.
  virtual int64_t size() const = 0;
  // Sample `index` in [0, size()): data as the model takes one sample (no batch dimension),
  // target as the loss takes one (a class index: a 0-dim int64 tensor).
  virtual Example get(int64_t index) const = 0;
  // Samples into one batch: by default data and targets each stacked along a new first dimension
  // (LibTorch's transforms::Stack, PyTorch's default_collate). Text pads here.
  virtual Example collate(std::vector<Example> samples) const;
  // The batch of samples `indices`: get() of each, then collate(). Override it when a batch can be
  // cut at once (an index_select of a tensor that holds the split).
  virtual Example get_batch(const std::vector<int64_t>& indices) const;
  // What `batch` counts towards a step's mean loss: its rows; a language model's, its target tokens.
  virtual int64_t count(const Example& batch) const { return batch.data.size(0); }
  // The replica's batches of an epoch; every replica gets as many. DistributedSampler's shuffled
  // order, cut into batch_size pieces (the last may be smaller).
  virtual std::vector<std::vector<int64_t>> batches(const EpochBatches& epoch);
  // Called before an epoch's batches are read, while none is being built: what a sample's
  // random transforms are keyed by (with the sample's index; see data::SampleRandom).
  virtual void set_epoch(int64_t epoch, uint64_t seed) {
    (void)epoch;
    (void)seed;
  }
  // Files a checkpoint directory must hold beside the checkpoints (text: tokenizer.json).
  virtual void save_beside_checkpoints(const std::string& dir) const { (void)dir; }
  // Figures of the run for the summary (text: padding, the unigram baseline), as JSON keys.
  virtual std::vector<std::pair<std::string, double>> figures() const { return {}; }
};

// DistributedSampler's order of `size` samples for one replica in one epoch, cut into
// micro-batches of `batch_size` (the last may be smaller): TrainingData::batches()'s default.
std::vector<std::vector<int64_t>> sampler_batches(int64_t size, const EpochBatches& epoch);

// A split held as two tensors: data (N, ...) and targets (N). get_batch() is one index_select.
class TensorData : public TrainingData {
 public:
  // Throws c10::ValueError when the first dimensions differ or the split is empty.
  TensorData(torch::Tensor data, torch::Tensor targets);

  int64_t size() const override { return data_.size(0); }
  Example get(int64_t index) const override;
  Example get_batch(const std::vector<int64_t>& indices) const override;

 private:
  torch::Tensor data_, targets_;
};

}  // namespace lockstep::train
