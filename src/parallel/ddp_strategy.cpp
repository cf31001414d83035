#include "lockstep/parallel/ddp_strategy.h"

#include <chrono>

namespace lockstep::parallel {
namespace {

// Every rank starts from rank 0's weights, checked and copied before amp::initialize converts the
// model, so O2's masters agree across ranks and the weights travel once.
torch::nn::AnyModule synced(torch::nn::AnyModule model, const StrategyOptions& options) {
  TORCH_CHECK_VALUE(options.group() != nullptr,
                    "the ddp strategy needs a process group: StrategyOptions().group(...), with the program started "
                    "under a launcher");
  sync_module_states(*model.ptr(), *options.group());
  return model;
}

}  // namespace

DdpStrategy::DdpStrategy(torch::nn::AnyModule model, StrategyOptions options, DistributedDataParallelOptions ddp)
    : LocalStrategy(synced(std::move(model), options), options), broadcast_buffers_(ddp.broadcast_buffers()) {
  ddp_ = std::make_unique<DistributedDataParallel>(this->model(), *this->options().group(),
                                                   ddp.init_sync(false).broadcast_buffers(false));
}

DdpStrategy::~DdpStrategy() = default;

double DdpStrategy::run_micro_batch(const MicroBatch& micro_batch, const LossFunction& loss, double loss_before,
                                    bool last) {
  if (broadcast_buffers_ && module().is_training()) {
    // DDP's broadcast before every training forward waits for rank 0 (for every rank on shared
    // memory): time spent on other ranks, not in this rank's forward.
    auto phase = profiler().scope(Phase::kSync);
    ddp_->broadcast_buffers();
  }
  if (!last) {
    auto no_sync = ddp_->no_sync();  // held over forward and backward: accumulate locally
    return LocalStrategy::run_micro_batch(micro_batch, loss, loss_before, last);
  }
  const double value = LocalStrategy::run_micro_batch(micro_batch, loss, loss_before, last);
  // DDP's final wait for the gradient all-reduce runs at the end of the last backward.
  profiler().split_tail(Phase::kSync, std::chrono::nanoseconds(ddp_->reducer_stats().finalize_ns));
  return value;
}

}  // namespace lockstep::parallel
