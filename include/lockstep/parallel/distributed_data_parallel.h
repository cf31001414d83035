#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include <memory>

#include "lockstep/dist/process_group.h"
#include "lockstep/parallel/reducer.h"

namespace lockstep::parallel {

struct DistributedDataParallelOptions {
  TORCH_ARG(double, bucket_cap_mb) = 25.0;         // bucket size cap, in MiB
  TORCH_ARG(bool, find_unused_parameters) = false;
  TORCH_ARG(bool, broadcast_buffers) = true;       // rank 0's buffers (BN statistics) each forward,
                                                   // except SyncBatchNorm's (equal on every rank)
  TORCH_ARG(CommHook, comm_hook) = CommHook::kNone;
  // Each .grad a view of its bucket slot, so averages need no copy back (see Note [Gradients as
  // bucket views]); off by default, as in PyTorch.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  // sync_module_states() at construction (PyTorch's init_sync). Turn off when the ranks already
  // hold rank 0's weights, e.g. synced before amp::initialize as DdpStrategy does.
  TORCH_ARG(bool, init_sync) = true;
};

// Checks that every rank holds the same parameters and buffers (names, shapes, dtypes) as rank 0,
// all ranks agreeing on the verdict, so either all go on or all throw, each naming the first
// difference it found; then copies rank 0's values to every rank in one broadcast.
void sync_module_states(torch::nn::Module& module, dist::ProcessGroup& group);

// torch.nn.parallel.DistributedDataParallel for LibTorch modules: one replica per process, only
// gradients travel, bucketed and all-reduced while backward runs (Note [Gradient buckets]).
// At construction, every rank checks it holds the same model as rank 0 and takes rank 0's
// parameters and buffers (sync_module_states; see init_sync).
//
//   auto group = lockstep::dist::init_process_group();
//   lockstep::parallel::DistributedDataParallel ddp(model, *group);
//   auto loss = criterion(ddp.forward(x), y);  loss.backward();  optimizer.step();
class DistributedDataParallel {
 public:
  template <typename ModuleType>
  DistributedDataParallel(std::shared_ptr<ModuleType> module, dist::ProcessGroup& group,
                          DistributedDataParallelOptions options = {})
      : DistributedDataParallel(torch::nn::AnyModule(std::move(module)), group, options) {}
  DistributedDataParallel(torch::nn::AnyModule module, dist::ProcessGroup& group,
                          DistributedDataParallelOptions options = {});
  ~DistributedDataParallel();

  // Broadcasts buffers (when enabled and training), runs the module, and prepares the reducer
  // for the backward of the returned output.
  template <typename... Args>
  torch::Tensor forward(Args&&... args) {
    pre_forward();
    torch::Tensor out = forward_.forward(std::forward<Args>(args)...);
    post_forward(out);
    return out;
  }

  // Inside the returned guard's lifetime, backward accumulates gradients locally without
  // communicating; the next backward outside it reduces the accumulated sum (PyTorch's no_sync).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Reducer& reducer) : reducer_(reducer), previous_(reducer.sync()) {
      reducer_.set_sync(false);
    }
    ~NoSyncGuard() { reducer_.set_sync(previous_); }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    Reducer& reducer_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*reducer_); }

  // Rank 0's buffers to every rank now, as a training forward does first with broadcast_buffers.
  // For a caller that times this wait apart from the forward: it builds with
  // broadcast_buffers(false) and calls this before each forward itself (DdpStrategy does).
  void broadcast_buffers();

  torch::nn::Module& module() { return *module_; }
  dist::ProcessGroup& group() { return group_; }
  const ReducerStats& reducer_stats() const { return reducer_->stats(); }

 private:
  void pre_forward();
  void post_forward(const torch::Tensor& out);
  std::vector<torch::Tensor> buffers_to_broadcast() const;

  torch::nn::AnyModule forward_;
  std::shared_ptr<torch::nn::Module> module_;
  dist::ProcessGroup& group_;
  DistributedDataParallelOptions options_;
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace lockstep::parallel
