#pragma once

#include <memory>

#include "lockstep/parallel/distributed_data_parallel.h"
#include "lockstep/parallel/local_strategy.h"

namespace lockstep::parallel {

// A replica per rank under DistributedDataParallel: rank 0's weights are checked against and
// copied to every rank once, before amp converts the model (one broadcast; mismatched models end
// every rank with DDP's error naming the first difference), then every micro-batch but the step's
// last runs under no_sync, so gradients travel once per optimizer step, bucketed during the last
// backward. Gradients are views of their buckets by default: the strategy drops them itself
// before each step (zero_grad with set_to_none), so nothing else holds them (see Note [Gradients
// as bucket views]).
class DdpStrategy : public LocalStrategy {
 public:
  // options.group() is required.
  DdpStrategy(torch::nn::AnyModule model, StrategyOptions options,
              DistributedDataParallelOptions ddp = DistributedDataParallelOptions().gradient_as_bucket_view(true));
  ~DdpStrategy() override;

  std::string name() const override { return "ddp"; }

 protected:
  torch::Tensor replica_forward(const torch::Tensor& input) override { return ddp_->forward(input); }
  double run_micro_batch(const MicroBatch& micro_batch, const LossFunction& loss, double loss_before,
                         bool last) override;

 private:
  bool broadcast_buffers_;  // DDP's option, run here so its wait is timed as sync, not forward
  std::unique_ptr<DistributedDataParallel> ddp_;
};

}  // namespace lockstep::parallel
