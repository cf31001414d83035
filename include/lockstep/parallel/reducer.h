#pragma once

#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lockstep/dist/process_group.h"

namespace torch::autograd {
struct Node;
}

namespace lockstep::parallel {

// A leaf's gradient accumulator as LibTorch hands it out: an owning pointer to the autograd node
// (a shared_ptr in older LibTorch, an intrusive_ptr in 2.14).
using GradAccumulator = decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>()));

// How a bucket travels: as it is, or compressed to 16 bits for the all-reduce and restored after
// (PyTorch's bf16_compress_hook / fp16_compress_hook). Gloo cannot sum bf16, so bf16 buckets are
// all-gathered as raw 16-bit words (typed Half, which Gloo copies without arithmetic) and summed in
// fp32 on arrival: the same bytes on the wire.
enum class CommHook { kNone, kBf16Compress, kFp16Compress };

struct ReducerOptions {
  int64_t bucket_cap_bytes = 25 * 1024 * 1024;
  int64_t first_bucket_cap_bytes = 1024 * 1024;  // small, so the first all-reduce starts early
  bool find_unused_parameters = false;
  CommHook comm_hook = CommHook::kNone;
  bool gradient_as_bucket_view = false;  // see Note [Gradients as bucket views]
};

// What the last synchronised backward did, to observe overlap and bucketing.
struct ReducerStats {
  std::vector<std::vector<int64_t>> buckets;  // parameter indices per bucket, in launch order
  std::vector<int64_t> hooks_before_launch;   // per bucket: gradient hooks fired when its all-reduce started
  int64_t hooks = 0;                          // gradient hooks fired in that backward
  int64_t finalize_ns = 0;  // that backward's end: waiting for the all-reduces, copying averages to .grad
};

// Note [Gradient buckets]: parameters are grouped, in reverse registration order (roughly the order
// backward produces their gradients), into flat buckets of one dtype capped in bytes. A post hook
// on each parameter's gradient accumulator copies the gradient into its bucket; when a bucket is
// full its all-reduce starts asynchronously while backward goes on. Buckets start strictly in
// index order, so every rank issues the same collectives in the same order. A callback queued on
// the autograd engine runs when backward ends: it waits for every bucket, averages, and copies the
// result back into each parameter's .grad, so optimizer.step() sees averaged gradients.
//
// Note [Gradients as bucket views]
// With gradient_as_bucket_view (PyTorch's option of the same name) a parameter's .grad becomes a
// view of its slot in the bucket once its gradient has been copied there, so finalize() copies
// nothing back: the all-reduce leaves the average in .grad itself. Later backwards accumulate into
// the view in place and only divide it there; after zero_grad(set_to_none) the gradient is handed
// over again and copied once. Per step that is one pass over the gradients instead of three (zero,
// copy in, copy out), which counts for wide models whose step is bound by memory and the network.
// The view is an alias without autograd view metadata, so optimizer.zero_grad()'s detach_()
// works on it. A parameter left unused by this backward takes its local gradient out of the
// bucket before the bucket's slot is zeroed.
class Reducer {
 public:
  Reducer(std::vector<torch::Tensor> params, std::vector<std::string> names,
          dist::ProcessGroup& group, ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // With find_unused_parameters: parameters not reachable from `outputs` get no gradient in the
  // coming backward, so they are marked ready (zero) as soon as backward starts.
  void prepare_for_backward(const std::vector<torch::Tensor>& outputs);

  // false inside no_sync(): backward accumulates into .grad locally without communicating.
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }

  const ReducerStats& stats() const { return stats_; }

 private:
  struct Bucket {
    std::vector<int64_t> params;   // indices into params_
    std::vector<int64_t> offsets;  // element offset of each in `flat`
    torch::Tensor flat;            // (sum of numels), the parameters' dtype
    torch::Tensor wire;            // what travels: `flat` itself or its 16-bit copy
    torch::Tensor world;           // 0-dim, the group size in flat's dtype: gradients are divided by it
    std::vector<torch::Tensor> gathered;  // bf16 on Gloo: every rank's `wire`, as raw 16-bit words
    c10::intrusive_ptr<c10d::Work> work;
    int64_t pending = 0;
  };

  void on_gradient(int64_t index);
  void mark_ready(int64_t index, bool used);
  void launch_ready_buckets();
  void finalize();
  void reset();

  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  dist::ProcessGroup& group_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> bucket_of_;  // per parameter
  std::vector<int64_t> slot_of_;    // per parameter: its position within its bucket
  std::vector<GradAccumulator> accumulators_;  // kept alive: they hold our hooks
  std::vector<uintptr_t> hook_keys_;

  std::mutex mutex_;
  bool sync_ = true;
  bool armed_ = false;                // the end-of-backward callback is queued
  std::vector<bool> ready_;
  std::vector<bool> unused_;          // unreachable from the last outputs (find_unused_parameters)
  torch::Tensor locally_used_;        // int32 (P): 1 where this rank produced a gradient
  size_t next_bucket_ = 0;
  int64_t hooks_ = 0;
  ReducerStats stats_;
};

}  // namespace lockstep::parallel
