#pragma once
// Batches built on worker threads while the step runs: what DataLoader(num_workers,
// prefetch_factor, persistent_workers=True) is to a PyTorch user.
//
// Note [Background loading]
// Workers are threads of the training process, not processes. A DataLoader forks processes
// because Python's interpreter lock would serialise decoding, and pays for it: every batch is
// pickled through a pipe or shared memory, and the data set's Python objects are copied page by
// page as reference counts touch them (pytorch#13246). In C++ decoding runs in parallel on
// threads, the data set (file list, classes, tensors) is shared as it is, and a finished batch is
// a tensor the step uses in place. A corrupt file cannot take a thread down: decoders report
// errors as exceptions, which next() rethrows on the training thread for the batch they belong to.
// The batches a run sees do not depend on the number of workers: the epoch's batches are fixed
// before loading starts (the sampler), they are handed out in order whoever built them, and a
// sample's random transforms are keyed by (seed, epoch, sample index) (data::SampleRandom), never
// by a worker's own stream (pytorch#5059).

#include <torch/arg.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "lockstep/train/training_data.h"

namespace lockstep::train {

struct LoaderOptions {
  // Threads that build batches while the step runs; 0: the training thread builds each batch
  // when it needs it (DataLoader's num_workers=0).
  TORCH_ARG(int64_t, workers) = 0;
  // Batches each worker may have built ahead of the step (DataLoader's prefetch_factor).
  TORCH_ARG(int64_t, prefetch) = 2;

 public:
  // Throws c10::ValueError naming a negative worker count or a prefetch below 1.
  void validate() const;
};

// An epoch's batches of `data`, in order, built by `options.workers()` threads up to
// workers x prefetch batches ahead of the one the caller takes (see Note [Background loading]).
// The workers live as long as the loader (persistent across epochs). Not thread-safe itself: one
// thread calls start() and next().
class BatchLoader {
 public:
  BatchLoader(std::shared_ptr<TrainingData> data, LoaderOptions options);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Begins an epoch: TrainingData::set_epoch(epoch, seed), then batches[from], batches[from + 1],
  // ... Batches of an earlier epoch still being built are finished and dropped first.
  void start(std::vector<std::vector<int64_t>> batches, int64_t from, int64_t epoch, uint64_t seed);
  // The next batch of the epoch, waiting for it if need be. Rethrows the error of a worker that
  // failed to build it. Throws c10::Error when the epoch has no batch left.
  Example next();

 private:
  void work();

  std::shared_ptr<TrainingData> data_;
  LoaderOptions options_;
  std::shared_ptr<const std::vector<std::vector<int64_t>>> batches_;
  int64_t next_ = 0;    // the batch next() returns
  int64_t issued_ = 0;  // the first batch no worker has taken yet
  int64_t busy_ = 0;    // workers building a batch
  bool stop_ = false;
  struct Built {
    Example batch;
    std::exception_ptr error;
  };
  std::map<int64_t, Built> built_;  // finished batches the caller has not taken yet
  std::mutex mutex_;
  std::condition_variable work_ready_, batch_ready_;
  std::vector<std::thread> threads_;
};

}  // namespace lockstep::train
