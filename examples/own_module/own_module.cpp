// Your own torch::nn::Module under any of lockstep's strategies: a residual MLP with LayerNorm and
// GELU that no model zoo knows, trained on data held in memory, with the strategy chosen by a flag.
//
//   ./build/own_module --strategy local --global-batch 32                 # one process
//   ./build/own_module --strategy dp --global-batch 32                    # one process, 2 replicas on threads
//   lockstep run --nproc-per-node 2 -- ./build/own_module --strategy ddp  # zero1, zero2, fsdp, pipeline too
//
// The model lists its blocks (the units fsdp shards and gathers one at a time, and a pipeline cuts
// into stages) by deriving from lockstep::models::Classifier; for local, dp, ddp, zero1 and zero2 any
// module whose forward takes and returns one tensor will do. Every replica trains on its share of
// each global batch, so the run ends where one process with the whole batch ends.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <memory>

#include "lockstep/core/world.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/models/classifier.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/strategy_registry.h"

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

int main(int argc, char** argv) {
  std::string strategy_name = "local", out;
  int64_t global_batch = 32, steps = 20, seed = 0;
  double lr = 0.05;
  CLI::App app("Trains a residual MLP of your own under a lockstep strategy; start it with `lockstep run` for several ranks.");
  app.option_defaults()->always_capture_default();
  app.add_option("--strategy", strategy_name, "local, dp, ddp, zero1, zero2, fsdp or pipeline")
      ->check(CLI::IsMember(parallel::strategy_names()));
  app.add_option("--global-batch", global_batch, "samples per step, over all replicas")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "SGD learning rate (momentum 0.9)");
  app.add_option("--seed", seed, "weights and data");
  app.add_option("--out", out, "write the trained weights here (rank 0; torch.load reads them)");
  CLI11_PARSE(app, argc, argv);

  try {
    const WorldInfo world = world_from_env();
    std::unique_ptr<dist::ProcessGroup> group;  // under a launcher: every rank joins
    if (world.world_size > 1) group = dist::init_process_group();

    // Data in memory: kFeatures features, kClasses classes that a linear map of the features decides.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const torch::Tensor x = torch::randn({steps * global_batch, kFeatures}, gen);       // (N, 16)
    const torch::Tensor y = x.matmul(torch::randn({kFeatures, kClasses}, gen)).argmax(1);  // (N)

    torch::manual_seed(seed);  // the same initial weights on every rank (the strategies also broadcast rank 0's)
    const auto make = [] { return ResidualMlp(kFeatures, 32, 2, kClasses); };
    const optim::OptimizerOptions sgd = optim::OptimizerOptions(optim::OptimizerKind::kSGD, lr).momentum(0.9);
    auto options = parallel::StrategyOptions()
                       .optimizer([sgd](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), sgd); })
                       .group(group.get())
                       .model_factory([make] { return torch::nn::AnyModule(make()); });  // dp's replicas
    auto strategy = parallel::make_strategy(parallel::parse_strategy(strategy_name), torch::nn::AnyModule(make()),
                                            std::move(options));

    // A pipeline's stages read the same batch: each replica, not each rank, takes a share.
    const int64_t replicas = world.world_size / strategy->ranks_per_replica();
    const int64_t replica = world.rank / strategy->ranks_per_replica();
    TORCH_CHECK_VALUE(global_batch % replicas == 0, "rank ", world.rank, ": --global-batch ", global_batch,
                      " does not split evenly over ", replicas, " replicas; pass a multiple of ", replicas);
    const int64_t rows = global_batch / replicas;
    const auto loss = [](const torch::Tensor& out, const torch::Tensor& target) {
      return torch::nn::functional::cross_entropy(out, target);
    };
    double first = 0.0, last = 0.0;
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t begin = step * global_batch + replica * rows;
      last = strategy->forward_backward({{x.narrow(0, begin, rows), y.narrow(0, begin, rows), 1.0}}, loss);
      if (step == 0) first = last;
      strategy->step();
    }
    const auto weights = strategy->model_state_dict();  // collective: every rank calls it
    if (world.rank == 0) {
      std::printf("%s, %lld rank(s), %lld replica(s) of %lld samples: loss %.4f at the first step, %.4f at the last\n",
                  strategy->name().c_str(), static_cast<long long>(world.world_size), static_cast<long long>(replicas),
                  static_cast<long long>(rows), first, last);
      if (!out.empty()) models::save_state_dict(weights, out);
    }
    if (group) group->barrier();  // nobody tears the group down while rank 0 still writes
  } catch (const c10::Error& e) {  // lockstep's errors name the value, the rank and the fix
    std::fprintf(stderr, "own_module: %s\n", e.what_without_backtrace());
    return 1;
  }
  return 0;
}
