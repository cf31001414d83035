#pragma once

#include <torch/arg.h>
#include <torch/types.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "lockstep/serve/statistics.h"

namespace lockstep::serve {

struct BatcherOptions {
  TORCH_ARG(int64_t, max_batch_size) = 64;           // samples per forward; 0: no batch dimension
  TORCH_ARG(bool, dynamic_batching) = true;          // false: one request per forward
  TORCH_ARG(std::vector<int64_t>, preferred_batch_sizes) = {};
  TORCH_ARG(int64_t, max_queue_delay_us) = 0;
  TORCH_ARG(int64_t, max_queue_size) = 0;            // queued requests; 0: unbounded
  TORCH_ARG(int64_t, queue_timeout_us) = 0;          // 0: none
  TORCH_ARG(int64_t, threads_per_instance) = 0;      // intra-op threads of each instance; 0: leave as is
};

// The queue is full, or the server is shutting down: the request is refused with 503.
class Unavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A request's or a forward's tensors: the model's inputs, or its outputs, in the config's order.
using Tensors = std::vector<torch::Tensor>;

// Note [Dynamic batching]
// Requests (each a list of input tensors of n >= 1 samples each) wait in one queue per model
// version; every model instance runs a worker thread that takes the next batch from the front of
// the queue, concatenates each input of the requests along dim 0, runs one forward and hands each
// request its rows of every output.
// A batch is sent as soon as
//   - its samples reach max_batch_size, or equal one of the preferred batch sizes, or
//   - the next queued request would not fit in it, or
//   - the oldest request in it has waited max_queue_delay_us (0: at once, with whatever is queued),
// Triton's rules. Requests are never split across batches and keep their arrival order. While every
// instance is busy the queue fills, so under load batches grow even without a delay: the delay only
// trades the latency of a lone request for fuller batches at low load. Beyond max_queue_size queued
// requests a new one is refused (503), as is one found to have waited longer than queue_timeout_us
// when the queue is next looked at (a batch forming, or a request arriving).
// With max_batch_size 0 the model has no batch dimension (Triton's convention): every request is a
// forward of its own, its tensors passed as they are.
class Batcher {
 public:
  // One function per model instance: inputs, each (B, ...) -> outputs, each (B, ...); each is called
  // from its own worker thread only, so an instance needs no lock of its own. Instances may run one
  // shared module side by side (see Note [Intra-op threads of instances]).
  using Instance = std::function<Tensors(const Tensors&)>;
  // An instance of a model with one input and one output (the reference models).
  static Instance one_tensor(std::function<torch::Tensor(const torch::Tensor&)> forward);

  Batcher(std::vector<Instance> instances, BatcherOptions options, ModelStatistics& statistics);
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Queues `inputs`, each (n, ...) with the same 1 <= n <= max_batch_size; the future holds the
  // request's outputs, each (n, ...), or the forward's exception, or Unavailable when it timed out
  // in the queue. Throws Unavailable when the queue is full or the batcher is stopping.
  std::future<Tensors> submit(Tensors inputs);
  // The same, but the future goes, ready, to `done`, called on the thread that settles it (an
  // instance's worker, or one finding it expired in the queue): for servers that answer without a
  // thread waiting per request (gRPC's callback API). `done` must be quick and must not throw.
  using Done = std::function<void(std::future<Tensors>)>;
  void submit(Tensors inputs, Done done);
  // Refuses new requests, runs every queued one (without waiting for delays) and joins the workers.
  void stop();

  const BatcherOptions& options() const { return options_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    Tensors inputs;
    int64_t samples;  // dim 0 of each input; 1 without a batch dimension
    Clock::time_point enqueued;
    std::promise<Tensors> result;
    Done done;                      // set: handed `future` once `result` is set
    std::future<Tensors> future;
  };
  int64_t checked_samples(const Tensors& inputs) const;
  void enqueue(Pending p);  // throws Unavailable when full or stopping
  static void settle(Pending& p, Tensors outputs);
  static void settle(Pending& p, std::exception_ptr error);
  void work(size_t instance);
  // Blocks until a batch is due (see Note [Dynamic batching]); empty once stopped and drained.
  std::vector<Pending> next_batch();
  void run(Instance& instance, std::vector<Pending>& batch);
  void expire_locked(Clock::time_point now);

  std::vector<Instance> instances_;
  BatcherOptions options_;
  ModelStatistics& statistics_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace lockstep::serve
