// Your own torch::nn::Module on your own data under any of lockstep's strategies, through one
// lockstep::train::Trainer: a residual MLP with LayerNorm and GELU that no model zoo knows, trained
// on features held in memory, with the strategy chosen by a flag.
//
//   ./build/own_module --strategy local --global-batch 32                 # one process
//   ./build/own_module --strategy dp --global-batch 32                    # one process, 2 replicas on threads
//   lockstep run --nproc-per-node 2 -- ./build/own_module --strategy ddp  # zero1, zero2, fsdp, pipeline too
//
// The model lists its blocks (the units fsdp shards and gathers one at a time, and a pipeline cuts
// into stages) by deriving from lockstep::models::Classifier; for local, dp, ddp, zero1 and zero2 any
// module whose forward takes and returns one tensor will do. The data implements
// lockstep::train::TrainingData: a size and one sample by index, as a LibTorch Dataset. Every replica
// trains on its share of each global batch, so the run ends where one process with the whole batch
// ends.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <memory>

#include "lockstep/core/world.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/models/classifier.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/strategy_registry.h"
#include "lockstep/train/trainer.h"

using namespace lockstep;

// x + fc2(gelu(fc1(layer_norm(x)))): the pre-norm residual block of a transformer's MLP.
struct ResidualBlockImpl : torch::nn::Module {
  explicit ResidualBlockImpl(int64_t width)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc1(register_module("fc1", torch::nn::Linear(width, 4 * width))),
        fc2(register_module("fc2", torch::nn::Linear(4 * width, width))) {}
  torch::Tensor forward(const torch::Tensor& x) {  // (B, width) -> (B, width)
    return x + fc2(torch::gelu(fc1(norm(x))));
  }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(ResidualBlock);

// features (B, in) -> logits (B, classes): a linear stem, `depth` residual blocks, a linear head.
// Modules are registered in the order the blocks run them: fsdp shards the parameters block by
// block and expects the model's parameter order to follow them.
struct ResidualMlpImpl : models::Classifier {
  ResidualMlpImpl(int64_t in, int64_t width, int64_t depth, int64_t classes) {
    stem = register_module("stem", torch::nn::Linear(in, width));
    for (int64_t i = 0; i < depth; ++i) layers.push_back(register_module("layer" + std::to_string(i), ResidualBlock(width)));
    head = register_module("head", torch::nn::Linear(width, classes));
  }
  // Classifier::forward() runs these in order.
  std::vector<models::Block> blocks() override {
    std::vector<models::Block> out;
    out.push_back({"stem", {stem.ptr()}, [s = stem.ptr()](const torch::Tensor& x) { return s->forward(x); }});
    for (size_t i = 0; i < layers.size(); ++i)
      out.push_back({"layer" + std::to_string(i), {layers[i].ptr()},
                     [b = layers[i].ptr()](const torch::Tensor& x) { return b->forward(x); }});
    out.push_back({"head", {head.ptr()}, [h = head.ptr()](const torch::Tensor& x) { return h->forward(x); }});
    return out;
  }
  torch::nn::Linear stem{nullptr}, head{nullptr};
  std::vector<ResidualBlock> layers;
};
TORCH_MODULE(ResidualMlp);

constexpr int64_t kFeatures = 16, kClasses = 4;

// The user's data: `n` samples of kFeatures random features (drawn from `seed`) whose class a
// fixed linear map of the features decides, the same map for every split. Only size() and get()
// are required; batches are stacked by the default collate.
class Features : public train::TrainingData {
 public:
  Features(int64_t n, uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    auto map_gen = at::make_generator<at::CPUGeneratorImpl>(/*seed=*/1234);
    x_ = torch::randn({n, kFeatures}, gen);                                        // (N, 16)
    y_ = x_.matmul(torch::randn({kFeatures, kClasses}, map_gen)).argmax(1);       // (N)
  }
  int64_t size() const override { return x_.size(0); }
  train::Example get(int64_t i) const override { return {x_[i], y_[i]}; }  // (16), ()

 private:
  torch::Tensor x_, y_;
};

int main(int argc, char** argv) {
  std::string strategy_name = "local", out;
  int64_t global_batch = 32, steps = 20, seed = 0, workers = 0;
  double lr = 0.05;
  CLI::App app("Trains a residual MLP of your own under a lockstep strategy; start it with `lockstep run` for several ranks.");
  app.option_defaults()->always_capture_default();
  app.add_option("--strategy", strategy_name, "local, dp, ddp, zero1, zero2, fsdp or pipeline")
      ->check(CLI::IsMember(parallel::strategy_names()));
  app.add_option("--global-batch", global_batch, "samples per step, over all replicas")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "optimizer steps (one epoch of steps x global batch samples)")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "SGD learning rate (momentum 0.9)");
  app.add_option("--seed", seed, "weights and data");
  app.add_option("--workers", workers, "threads that build batches while the step runs (0: the training thread)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--out", out, "write the trained weights here (rank 0; torch.load reads them)");
  CLI11_PARSE(app, argc, argv);

  try {
    const WorldInfo world = world_from_env();
    std::shared_ptr<dist::ProcessGroup> group;  // under a launcher: every rank joins
    if (world.world_size > 1) group = dist::init_process_group();
    const parallel::StrategyKind kind = parallel::parse_strategy(strategy_name);
    // A pipeline's stages (one per rank) read the same batch: one replica; otherwise every rank is one.
    const int64_t replicas = kind == parallel::StrategyKind::kPipeline ? 1 : world.world_size;
    TORCH_CHECK_VALUE(global_batch % replicas == 0, "rank ", world.rank, ": --global-batch ", global_batch,
                      " does not split evenly over ", replicas, " replicas; pass a multiple of ", replicas);

    torch::manual_seed(seed);  // the same initial weights on every rank (the strategies also broadcast rank 0's)
    const auto make = [] { return ResidualMlp(kFeatures, 32, 2, kClasses); };
    const optim::OptimizerOptions sgd = optim::OptimizerOptions(optim::OptimizerKind::kSGD, lr).momentum(0.9);
    auto options =
        train::TrainerOptions()
            .strategy(kind)
            .strategy_options(
                parallel::StrategyOptions()
                    .optimizer([sgd](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), sgd); })
                    .group(group)
                    .model_factory([make] { return torch::nn::AnyModule(make()); }))  // dp's replicas
            .batch_size(global_batch / replicas)  // per replica
            .seed(seed)
            .loader(train::LoaderOptions().workers(workers))  // the same batches for any count
            .save_model(out);
    train::Trainer trainer(torch::nn::AnyModule(make()), std::make_shared<Features>(steps * global_batch, seed), options,
                           std::make_shared<Features>(1000, seed + 1));
    const train::TrainResult r = trainer.fit();
    if (world.rank == 0)
      std::printf("%s, %lld rank(s), %lld replica(s) of %lld samples: rank 0's loss %.4f at the first step, %.4f at "
                  "the last; held-out accuracy %.3f\n",
                  trainer.strategy().name().c_str(), static_cast<long long>(world.world_size),
                  static_cast<long long>(replicas), static_cast<long long>(global_batch / replicas),
                  r.step_losses.front(), r.step_losses.back(), r.test_acc);
  } catch (const c10::Error& e) {  // lockstep's errors name the value, the rank and the fix
    std::fprintf(stderr, "own_module: %s\n", e.what_without_backtrace());
    return 1;
  }
  return 0;
}
