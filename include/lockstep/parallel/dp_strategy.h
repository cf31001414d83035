#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "lockstep/parallel/local_strategy.h"

namespace lockstep::parallel {

// Note [DataParallel on CPU threads]
// torch.nn.DataParallel is one process driving N devices: each forward scatters the batch along
// dim 0, runs a replica of the module per device in parallel, gathers the outputs on the first
// device, and the loss is computed there; backward flows back through the gather into every
// replica, whose gradients are summed into the module. The CPU analogue here: N replicas, each
// driven by a thread of its own with (intra-op threads / N) OpenMP threads (at least 1), so the
// replicas together use the cores one process would. A step:
//   1. every replica gets the primary's weights (after the last optimizer step) and buffers,
//      as DataParallel's replicate() does before each forward;
//   2. each micro-batch is split into N chunks (torch.chunk: the last may be smaller, and a batch
//      smaller than N uses fewer replicas); replica i runs forward on chunk i on its thread;
//   3. the outputs are concatenated (detached) on the calling thread, the loss of the whole
//      micro-batch is computed there, and its backward gives d loss / d output;
//   4. each replica runs backward of its output with its rows of that gradient, in parallel;
//   5. after the step's last micro-batch the replicas' gradients are summed into the primary
//      replica's, and the optimizer steps the primary (LocalStrategy::step: amp, clipping).
// Because the loss sees the gathered output, any loss function gives the gradient one replica
// would get on the whole batch: the result equals LocalStrategy's up to summation order.
// BatchNorm: as in PyTorch, each replica normalises with its own chunk's statistics (not the
// whole batch's: use ddp with --sync-bn for that), and the running statistics kept are replica
// 0's, i.e. chunk 0's (DataParallel's replica on devices[0] shares the module's buffers; the
// others' updates are discarded).
// Replica 0 is the primary module itself; the other N-1 are built by StrategyOptions'
// model_factory. Memory is therefore N copies of the parameters and gradients in one process.

// Persistent threads, one per replica, each with its own intra-op thread count (set once, on the
// thread: OpenMP's thread count is per thread). run() hands job(i) to thread i and waits.
class ReplicaThreads {
 public:
  ReplicaThreads(int64_t count, int64_t intra_op_threads);
  ~ReplicaThreads();
  ReplicaThreads(const ReplicaThreads&) = delete;
  ReplicaThreads& operator=(const ReplicaThreads&) = delete;

  // Runs job(0) ... job(n - 1), n <= count, one per thread, with the caller's grad mode; returns
  // when all have finished, rethrowing the first exception one of them threw.
  void run(size_t n, const std::function<void(size_t)>& job);

 private:
  void loop(size_t index, int64_t intra_op_threads);

  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<void(size_t)>* job_ = nullptr;
  size_t jobs_ = 0;           // job_ runs on threads [0, jobs_)
  size_t pending_ = 0;        // of those, still running
  uint64_t generation_ = 0;   // bumped per run(), so a thread runs each job once
  bool grad_enabled_ = true;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

// See Note [DataParallel on CPU threads]. One process only; options.model_factory() is required.
class DpStrategy : public LocalStrategy {
 public:
  DpStrategy(torch::nn::AnyModule model, StrategyOptions options);
  ~DpStrategy() override;

  std::string name() const override { return "dp"; }
  double forward_backward(const std::vector<MicroBatch>& micro_batches, const LossFunction& loss) override;
  // Evaluation is scattered over the replicas too, as DataParallel's forward is.
  torch::Tensor forward(const torch::Tensor& input) override;
  // The primary's memory plus the other replicas' parameters and gradients.
  MemoryReport memory() const override;

  int64_t replicas() const { return static_cast<int64_t>(replicas_.size()); }

 protected:
  double run_micro_batch(const MicroBatch& micro_batch, const LossFunction& loss, double loss_before,
                         bool last) override;

 private:
  // Copies the primary's parameters (with_parameters) and buffers into replicas 1.., and its
  // train/eval mode.
  void refresh(bool with_parameters);
  // Refreshes the replicas, scatters `input` over them and runs their forward in parallel: one
  // output per chunk.
  std::vector<torch::Tensor> parallel_forward(const torch::Tensor& input, bool with_parameters);
  // Adds replicas 1..'s gradients into the primary's.
  void reduce_gradients();

  std::vector<torch::nn::AnyModule> replicas_;  // [0]: the primary module
  std::unique_ptr<ReplicaThreads> threads_;
};

}  // namespace lockstep::parallel
