#pragma once
// The intra-host all-reduce, broadcast, all-gather and reduce-scatter behind dist::ProcessGroup;
// see Note [Collectives through shared memory] in shm_collectives.cpp. Internal to src/dist: users
// reach it through ProcessGroup.

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/dist/process_group.h"
#include "job_queue.h"
#include "shm_segment.h"

namespace lockstep::dist {

// A Work that a group's worker thread completes (shared memory's, the hierarchical all-reduce's),
// whose wait() gives the worker's own error, which names who did not arrive, the time to arrive:
// the worker fails every collective by its deadline, so waiting a moment past it suffices.
// It holds no tensor, and the worker drops its own reference before completing, so the caller's
// thread makes the last release of what it allocated. A release on the worker, at whatever moment,
// would take bytes off the caller's count in the middle of a measurement (see Note [Counting tensor
// bytes]: a free is charged to the allocating thread).
class QueuedWork : public c10d::Work {
 public:
  QueuedWork(int rank, c10d::OpType type, std::chrono::steady_clock::time_point deadline)
      : c10d::Work(rank, type), deadline_(deadline) {}

  void complete(std::exception_ptr error) { finish(std::move(error)); }

  bool wait(std::chrono::milliseconds timeout) override {
    constexpr auto kGrace = std::chrono::seconds(1);
    const auto last = deadline_ + kGrace;
    const auto until = timeout == kNoTimeout ? last : std::max(std::chrono::steady_clock::now() + timeout, last);
    std::unique_lock<std::mutex> lock(mutex_);
    TORCH_CHECK(cv_.wait_until(lock, until, [&] { return completed_; }),
                "a shared-memory collective did not finish by its deadline");
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }

 private:
  std::chrono::steady_clock::time_point deadline_;
};

class ShmCollectives {
 public:
  // Collective over a group whose ranks share memory (HostMap::shares_memory; see
  // ShmSegment::open): nullptr on every rank when a rank could not map the segment.
  static std::unique_ptr<ShmCollectives> create(c10d::Store& store, int64_t rank, int64_t size,
                                                std::chrono::milliseconds timeout);
  ~ShmCollectives();
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  // Whether all_reduce takes `tensor` with `op`: contiguous CPU fp32/fp64/fp16/bf16, kSum or kMean.
  static bool accepts(const torch::Tensor& tensor, ReduceOp op);
  // Whether broadcast takes `tensor`: contiguous CPU, any dtype (it moves bytes).
  static bool accepts_broadcast(const torch::Tensor& tensor);
  // Whether all_gather takes `input` into `output`: both contiguous CPU of one dtype (it moves bytes).
  static bool accepts_all_gather(const torch::Tensor& output, const torch::Tensor& input);
  // Whether reduce_scatter takes `input` into `output` with `op`: both contiguous CPU, one dtype, kSum
  // of fp32/fp64/fp16/bf16 or kMean of fp32/fp64 (the caller divides, as Gloo's path does in fp32).
  static bool accepts_reduce_scatter(const torch::Tensor& output, const torch::Tensor& input, ReduceOp op);
  // kQueue: the worker runs it and the call returns at once. kNowIfIdle, for a caller that waits
  // for it next: when the worker is idle and nothing is queued, it runs on the calling thread and
  // returns completed (Note [Collectives on the calling thread]); else it is queued.
  enum class When { kQueue, kNowIfIdle };
  // Each queues its collective and returns at once; collectives run in issue order. all_reduce and
  // broadcast work on `tensor` in place; all_gather puts every rank's `input` (n elements) into
  // `output` (N x n, rank order); reduce_scatter sums the ranks' `input`, whose consecutive parts
  // hold counts[0], counts[1], ... elements, and gives this rank's part into `output` (counts[rank]).
  c10::intrusive_ptr<c10d::Work> all_reduce(const torch::Tensor& tensor, When when = When::kQueue);
  c10::intrusive_ptr<c10d::Work> broadcast(const torch::Tensor& tensor, int64_t root, When when = When::kQueue);
  c10::intrusive_ptr<c10d::Work> all_gather(const torch::Tensor& output, const torch::Tensor& input,
                                            When when = When::kQueue);
  c10::intrusive_ptr<c10d::Work> reduce_scatter(const torch::Tensor& output, const torch::Tensor& input,
                                                std::vector<int64_t> counts, When when = When::kQueue);

  enum class Kind : int32_t { kAllReduce, kBroadcast, kAllGather, kReduceScatter };
  static const char* name_of(Kind kind) {  // "all-reduce", ...
    const char* names[] = {"all-reduce", "broadcast", "all-gather", "reduce-scatter"};
    return names[static_cast<int>(kind)];
  }

 private:
  struct Job {
    Kind kind = Kind::kAllReduce;
    torch::Tensor tensor;  // in place (all-reduce, broadcast), or the input
    torch::Tensor output;  // all-gather, reduce-scatter
    std::vector<int64_t> counts;  // reduce-scatter: each rank's part, in elements
    int64_t root = -1;  // a broadcast's source rank
    c10::intrusive_ptr<QueuedWork> work;
    uint64_t seq = 0;
    std::chrono::steady_clock::time_point deadline;
    const char* name() const { return name_of(kind); }
  };
  c10::intrusive_ptr<c10d::Work> enqueue(Job job, c10d::OpType type, When when);
  // Runs `job` (the worker's or a caller's turn) and completes its work.
  void execute(Job job);
  ShmCollectives(std::unique_ptr<ShmSegment> segment, int64_t rank, int64_t size, std::chrono::milliseconds timeout);
  void work_loop();
  void run(const Job& job);
  void run_all_gather(const Job& job);      // shm_gather_scatter.cpp
  void run_reduce_scatter(const Job& job);  // shm_gather_scatter.cpp
  void describe(const Job& job);  // this rank's line: what it is in, for check_shapes
  void announce();
  // Waits until every rank has announced as many steps as this one; `step` says what they bring.
  void await_all(const Job& job, int64_t chunk, int64_t chunks, const char* step);
  void check_shapes(const Job& job);
  void sum_slice(const Job& job, const char* chunk, int64_t begin, int64_t count);
  void abandon();

  std::unique_ptr<ShmSegment> segment_;
  int64_t rank_;
  int64_t size_;
  std::chrono::milliseconds timeout_;
  uint32_t stage_ = 0;  // steps this rank has announced (two per chunk); wraps
  std::string failure_;  // the first failed collective's error: later ones fail with it
  std::atomic<bool> aborting_{false};

  JobQueue<Job> jobs_;
  std::thread worker_;  // last: started when everything above exists
};

}  // namespace lockstep::dist
