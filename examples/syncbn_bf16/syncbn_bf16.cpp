// SyncBatchNorm and bf16 mixed precision on a convolutional network of your own, through
// lockstep::train::Trainer: the model is written with plain BatchNorm2d layers, and the Trainer
// converts them (PyTorch's SyncBatchNorm.convert_sync_batchnorm, Apex's convert_syncbn_model) so
// that every rank normalises over the global batch, as one process with the whole batch does.
//
//   ./build/syncbn_bf16 --global-batch 32                                                   # one process
//   lockstep run --nproc-per-node 2 -- ./build/syncbn_bf16 --global-batch 32                # DDP + SyncBN
//   lockstep run --nproc-per-node 2 -- ./build/syncbn_bf16 --global-batch 32 --precision bf16
//
// bf16 is autocast (Apex O1): matrix products and convolutions in bf16, weights, BatchNorm and the
// loss in fp32; bf16 has fp32's exponent range, so no loss scaling.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <memory>

#include "lockstep/core/world.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/train/trainer.h"

using namespace lockstep;

// (B, 1, 12, 12) images -> (B, 4) logits: two conv + BatchNorm + ReLU layers, pooled, and a head.
struct SmallConvNetImpl : torch::nn::Module {
  SmallConvNetImpl()
      : features(register_module(
            "features", torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)),
                                              torch::nn::BatchNorm2d(8), torch::nn::ReLU(),
                                              torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1)),
                                              torch::nn::BatchNorm2d(16), torch::nn::ReLU()))),
        head(register_module("head", torch::nn::Linear(16, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head(features->forward(x).mean({2, 3})); }
  torch::nn::Sequential features;
  torch::nn::Linear head;
};
TORCH_MODULE(SmallConvNet);

// Noisy images whose class is the brightest quadrant.
std::shared_ptr<train::TensorData> quadrants(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const torch::Tensor label = torch::randint(4, {n}, gen, torch::kLong);
  torch::Tensor bright = torch::zeros({4, 1, 12, 12});  // class q: +1.5 in quadrant q
  for (int64_t q = 0; q < 4; ++q) bright[q].narrow(1, (q / 2) * 6, 6).narrow(2, (q % 2) * 6, 6).fill_(1.5);
  return std::make_shared<train::TensorData>(torch::randn({n, 1, 12, 12}, gen) + bright.index_select(0, label), label);
}

int main(int argc, char** argv) {
  std::string precision = "fp32", out;
  int64_t global_batch = 32, steps = 100;
  bool no_sync_bn = false;
  CLI::App app("Trains a convolutional network with SyncBatchNorm, in fp32 or bf16 mixed precision.");
  app.option_defaults()->always_capture_default();
  app.add_option("--precision", precision, "fp32, or bf16 autocast")->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--global-batch", global_batch, "samples per step, over all ranks")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "optimizer steps (one epoch)")->check(CLI::PositiveNumber);
  app.add_flag("--no-sync-bn", no_sync_bn, "keep plain BatchNorm: each rank normalises over its own share only");
  app.add_option("--out", out, "write the trained weights and BatchNorm statistics here (rank 0)");
  CLI11_PARSE(app, argc, argv);

  try {
    const WorldInfo world = world_from_env();
    std::shared_ptr<dist::ProcessGroup> group;
    if (world.world_size > 1) group = dist::init_process_group();
    TORCH_CHECK_VALUE(global_batch % world.world_size == 0, "rank ", world.rank, ": --global-batch ", global_batch,
                      " does not split over ", world.world_size, " ranks; pass a multiple of ", world.world_size);

    torch::manual_seed(0);
    const auto sgd = optim::OptimizerOptions(optim::OptimizerKind::kSGD, 0.05).momentum(0.9);
    auto strategy = parallel::StrategyOptions()
                        .optimizer([sgd](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), sgd); })
                        .group(group);
    if (precision == "bf16")
      strategy.opt_level(amp::OptLevel::kO1).half_dtype(torch::kBFloat16).loss_scale(amp::GradScalerOptions().enabled(false));
    auto options = train::TrainerOptions()  // strategy unset: ddp on several ranks, local on one
                       .strategy_options(strategy)
                       .sync_batchnorm(!no_sync_bn)
                       .batch_size(global_batch / world.world_size)
                       .save_model(out);
    train::Trainer trainer(torch::nn::AnyModule(SmallConvNet()), quadrants(steps * global_batch, 1), options,
                           quadrants(512, 2));
    const train::TrainResult r = trainer.fit();
    if (world.rank == 0)
      std::printf("%s, %s, %s on %lld rank(s): rank 0's loss %.4f at the first step, %.4f at the last; held-out "
                  "accuracy %.3f\n",
                  trainer.strategy().name().c_str(), precision.c_str(), no_sync_bn ? "BatchNorm" : "SyncBatchNorm",
                  static_cast<long long>(world.world_size), r.step_losses.front(), r.step_losses.back(), r.test_acc);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "syncbn_bf16: %s\n", e.what_without_backtrace());
    return 1;
  }
  return 0;
}
