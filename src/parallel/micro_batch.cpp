#include "lockstep/parallel/micro_batch.h"

namespace lockstep::parallel {

double run_micro_batch(const MicroBatch& micro_batch, const LossFunction& loss_fn,
                       const std::function<torch::Tensor(const torch::Tensor&)>& forward, amp::Amp& amp,
                       StepProfiler& profiler, StepGuard& guard, double loss_before, bool last) {
  torch::Tensor out, loss;
  {
    auto phase = profiler.scope(Phase::kForward);
    auto autocast = amp.autocast();
    out = amp.cast_output(forward(amp.cast_input(micro_batch.input)));
  }
  {
    auto phase = profiler.scope(Phase::kLoss);
    auto autocast = amp.autocast();
    loss = loss_fn(out, micro_batch.target) * micro_batch.weight;
  }
  const double value = loss.item<double>();
  if (last) guard.start_vote(loss_before + value);
  {
    auto phase = profiler.scope(Phase::kBackward);
    amp.scale_loss(loss).backward();
  }
  return value;
}

}  // namespace lockstep::parallel
