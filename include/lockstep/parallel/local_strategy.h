#pragma once

#include <memory>

#include "lockstep/parallel/step_guard.h"
#include "lockstep/parallel/strategy.h"

namespace lockstep::parallel {

// One replica of the model on this process, trained as a Python user trains without a wrapper:
// each micro-batch's forward (under the opt level's precision), weighted loss and backward,
// gradients accumulating in .grad; then clipping and the optimizer step through amp (loss
// scaling, O2 masters), skipped when non-finite. DdpStrategy reuses all of it and changes only
// how the replica runs and when gradients travel.
class LocalStrategy : public Strategy {
 public:
  LocalStrategy(torch::nn::AnyModule model, StrategyOptions options);
  ~LocalStrategy() override;

  std::string name() const override { return "local"; }
  double forward_backward(const std::vector<MicroBatch>& micro_batches, const LossFunction& loss) override;
  StepDecision step() override;
  torch::Tensor forward(const torch::Tensor& input) override;
  torch::nn::Module& module() override { return *module_; }
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  double loss_scale() const override;
  c10::Dict<std::string, torch::Tensor> model_state_dict() override;
  c10::impl::GenericDict training_state_dict() override;
  void load_training_state_dict(const c10::impl::GenericDict& state, const std::string& source) override;
  MemoryReport memory() const override;

 protected:
  // The replica's forward of an input already cast to the opt level's precision.
  virtual torch::Tensor replica_forward(const torch::Tensor& input) { return model_.forward(input); }
  // Forward, loss and backward of one micro-batch; returns its weighted loss. `loss_before` is
  // the step's loss so far; the `last` micro-batch starts the non-finite vote before its backward.
  virtual double run_micro_batch(const MicroBatch& micro_batch, const LossFunction& loss, double loss_before,
                                 bool last);

  const torch::nn::AnyModule& model() const { return model_; }
  const StrategyOptions& options() const { return options_; }
  StepProfiler& profiler() { return *profiler_; }
  const amp::Amp& amp() const { return *amp_; }
  StepGuard& guard() { return guard_; }

 private:
  torch::nn::AnyModule model_;
  std::shared_ptr<torch::nn::Module> module_;
  StrategyOptions options_;
  std::unique_ptr<StepProfiler> disabled_profiler_;  // when options name none
  StepProfiler* profiler_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<amp::Amp> amp_;
  StepGuard guard_;
};

}  // namespace lockstep::parallel
