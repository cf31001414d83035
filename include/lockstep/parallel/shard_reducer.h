#pragma once

#include <c10/util/Optional.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "lockstep/dist/process_group.h"
#include "lockstep/parallel/flat_parameters.h"
#include "lockstep/parallel/reducer.h"

namespace torch::autograd {
struct Node;
}

namespace lockstep::parallel {

// Note [Reducing gradients into shards]
// ZeRO-2 keeps only its shard's gradient. As in DDP (Note [Gradient buckets]) a post hook on each
// parameter's gradient accumulator takes the gradient as soon as backward has produced it: it is
// divided by N on its way into its bucket's staging buffer and the parameter's .grad is released at
// once, so a full-size gradient never lives longer than its bucket. Buckets are ranges of
// consecutive parameters of the flat layout (Note [Flat parameters and shards]), in reverse order,
// capped in bytes; the first holds the padding. When a bucket is complete it is reduce-scattered
// (dist's reduce_scatter with counts: each rank receives the sum of the part of the range that
// lies in its shard, nothing when none does) and added into the shard's gradient, buckets strictly
// in index order so every rank issues the same collectives. Every backward reduces, so gradient
// accumulation adds micro-batch after micro-batch into the shard (DeepSpeed's stage 2 does the
// same; the full gradient is never held). Parameters that got no gradient are reduced as zeros by
// a callback at the end of backward. Costs per backward: (N-1)/N x Psi elements sent per rank.
// A bucket's reduce_scatter is started, not waited for (dist's reduce_scatter_async: between the
// ranks of one host the group's worker runs it), so backward goes on computing while it travels,
// as DDP's all-reduces do; the bucket is landed (waited for, added into the shard, its staging
// freed) when the next bucket starts, and the last at the end of backward. So at most one bucket
// is in flight beside the one filling: two buckets' staging at a time, not the whole gradient.
class ShardReducer {
 public:
  // grad_shard: (S) fp32, the shard's gradient that every backward adds into. `reduced`, when set,
  // runs once a backward's last bucket is reduced, inside that backward (FSDP frees its unit there).
  ShardReducer(const FlatParameters& flat, torch::Tensor grad_shard, dist::ProcessGroup& group,
               int64_t bucket_cap_bytes, std::function<void()> reduced = nullptr);
  ~ShardReducer();
  ShardReducer(const ShardReducer&) = delete;
  ShardReducer& operator=(const ShardReducer&) = delete;

  int64_t bucket_count() const { return static_cast<int64_t>(buckets_.size()); }
  // The largest bucket's staging buffer: gradient bytes held beyond the shard while backward runs.
  int64_t largest_bucket_bytes() const;

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;    // range of the flat layout, padding included in the first
    std::vector<int64_t> params;   // indices into flat.params()
    torch::Tensor staging;         // (end - begin) fp32 while filling, undefined otherwise
    int64_t pending = 0;
  };

  // A bucket whose reduce_scatter runs while backward goes on (Note [Reducing gradients into shards]).
  struct InFlight {
    c10::intrusive_ptr<c10d::Work> work;
    torch::Tensor staging, reduced;  // the bucket's input, kept until the work is done; this rank's part
    int64_t shard_offset = 0;        // where `reduced` adds into grad_shard
  };

  void on_gradient(int64_t index);
  void launch_ready_buckets();
  // Waits for the bucket in flight, if any, and adds its part into the shard's gradient.
  void land_in_flight();
  void finalize();

  const FlatParameters& flat_;
  torch::Tensor grad_shard_;
  dist::ProcessGroup& group_;
  torch::Tensor world_;  // 0-dim, N: gradients are divided by it on their way into a bucket
  std::vector<Bucket> buckets_;
  std::vector<int64_t> bucket_of_;  // per parameter
  std::vector<GradAccumulator> accumulators_;  // kept alive: they hold our hooks
  std::vector<uintptr_t> hook_keys_;
  std::function<void()> reduced_;

  std::mutex mutex_;
  bool armed_ = false;  // the end-of-backward callback is queued
  std::vector<bool> ready_;
  size_t next_bucket_ = 0;
  c10::optional<InFlight> in_flight_;
};

}  // namespace lockstep::parallel
