#pragma once
// The all-reduce of ranks on several hosts behind dist::ProcessGroup; see Note [Hierarchical
// all-reduce] in hierarchical_all_reduce.cpp. Internal to src/dist: users reach it through
// ProcessGroup (InitOptions::allreduce).

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "lockstep/dist/process_group.h"
#include "job_queue.h"
#include "shm_collectives.h"

namespace lockstep::dist {

class HierarchicalAllReduce {
 public:
  // `local`: the ranks of this rank's host; `cross`: one rank per host, those with this rank's
  // position among its host's ranks. Every host holds local->size() ranks. Both are subgroups of
  // one parent, made collectively by every rank of it.
  HierarchicalAllReduce(std::unique_ptr<ProcessGroup> local, std::unique_ptr<ProcessGroup> cross,
                        std::chrono::milliseconds timeout);
  ~HierarchicalAllReduce();
  HierarchicalAllReduce(const HierarchicalAllReduce&) = delete;
  HierarchicalAllReduce& operator=(const HierarchicalAllReduce&) = delete;

  // Whether all_reduce takes `tensor` with `op`: a sum or mean of contiguous CPU fp32, fp64 or fp16
  // (what both shared memory and Gloo can add; bf16 cannot cross Gloo).
  static bool accepts(const torch::Tensor& tensor, ReduceOp op);
  // Queues a sum of `tensor` over every rank, in place, and returns at once; they run in issue order.
  c10::intrusive_ptr<c10d::Work> all_reduce(const torch::Tensor& tensor);
  // "hierarchical (2 hosts x 2 ranks; inside a host through shared memory, across hosts over Gloo)"
  std::string describe() const;

 private:
  struct Job {
    torch::Tensor tensor;
    c10::intrusive_ptr<QueuedWork> work;
  };
  void work_loop();
  void run(const torch::Tensor& tensor);

  static constexpr int64_t kPieceBytes = int64_t{2} << 20;  // see Note [Hierarchical all-reduce]

  std::unique_ptr<ProcessGroup> local_;
  std::unique_ptr<ProcessGroup> cross_;
  std::chrono::milliseconds timeout_;

  JobQueue<Job> jobs_;
  std::thread worker_;  // last: started when everything above exists
};

}  // namespace lockstep::dist
