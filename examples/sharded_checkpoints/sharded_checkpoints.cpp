// ZeRO or FSDP with sharded checkpoints and exact resume, through lockstep::train::Trainer.
//
//   lockstep run --nproc-per-node 2 -- ./build/sharded_checkpoints --strategy fsdp --epochs 3 --checkpoint-dir ckpt
//   # stopped (or killed) part way? the same command with --resume latest continues where the last save left off:
//   lockstep run --nproc-per-node 2 -- ./build/sharded_checkpoints --strategy fsdp --epochs 3 --checkpoint-dir ckpt \
//       --resume latest
//
// Every rank writes only the shards it holds (ckpt/step-N/rank-R-of-W.pt, then rank 0 writes
// metadata.pt last: torch.distributed.checkpoint's layout, each file readable by Python's
// torch.load); nothing of the model is gathered to save it. A resumed run on as many ranks reads
// back only its own file and ends bit for bit where an uninterrupted run ends. With a different
// world size or strategy, the shards are put back together on every rank and training goes on.
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

// (B, 32) -> (B, 8): two hidden layers and a head. FSDP shards it block by block, so it lists its
// blocks (models::Classifier) with its layers registered in that order.
struct TabularNetImpl : models::Classifier {
  TabularNetImpl() {
    hidden1 = register_module("hidden1", torch::nn::Linear(32, 64));
    hidden2 = register_module("hidden2", torch::nn::Linear(64, 64));
    head = register_module("head", torch::nn::Linear(64, 8));
  }
  std::vector<models::Block> blocks() override {
    return {{"hidden1", {hidden1.ptr()}, [l = hidden1.ptr()](const torch::Tensor& x) { return torch::relu(l->forward(x)); }},
            {"hidden2", {hidden2.ptr()}, [l = hidden2.ptr()](const torch::Tensor& x) { return torch::relu(l->forward(x)); }},
            {"head", {head.ptr()}, [l = head.ptr()](const torch::Tensor& x) { return l->forward(x); }}};
  }
  torch::nn::Linear hidden1{nullptr}, hidden2{nullptr}, head{nullptr};
};
TORCH_MODULE(TabularNet);

// In-memory data as two tensors: rows of 32 features, 8 classes a fixed rule decides.
std::shared_ptr<train::TensorData> tabular(int64_t rows, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto rule = at::make_generator<at::CPUGeneratorImpl>(/*seed=*/42);
  const torch::Tensor x = torch::randn({rows, 32}, gen);
  return std::make_shared<train::TensorData>(x, torch::tanh(x).matmul(torch::randn({32, 8}, rule)).argmax(1));
}

int main(int argc, char** argv) {
  std::string strategy_name = "fsdp", checkpoint_dir, resume, out;
  int64_t epochs = 3, batch_size = 16, samples = 512, save_every = 0;
  uint64_t seed = 0;
  CLI::App app("Trains under ZeRO or FSDP with sharded checkpoints; resumes exactly with --resume latest.");
  app.option_defaults()->always_capture_default();
  app.add_option("--strategy", strategy_name, "zero1, zero2 or fsdp")->check(CLI::IsMember({"zero1", "zero2", "fsdp"}));
  app.add_option("--epochs", epochs, "epochs in all (a resumed run counts the ones done)")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch_size, "samples per step and rank")->check(CLI::PositiveNumber);
  app.add_option("--samples", samples, "training samples")->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-dir", checkpoint_dir, "where each save's directory of shards goes")->required();
  app.add_option("--save-every", save_every, "also save every N steps (0: at epoch ends only)");
  app.add_option("--resume", resume, "'latest' in --checkpoint-dir, or a step directory");
  app.add_option("--seed", seed, "weights and data");
  app.add_option("--out", out, "write the trained weights here, gathered (rank 0; torch.load reads them)");
  CLI11_PARSE(app, argc, argv);

  try {
    const WorldInfo world = world_from_env();
    std::shared_ptr<dist::ProcessGroup> group;
    if (world.world_size > 1) group = dist::init_process_group();

    torch::manual_seed(seed);
    const auto adam = optim::OptimizerOptions(optim::OptimizerKind::kAdamW, 1e-2);
    auto options =
        train::TrainerOptions()
            .strategy(parallel::parse_strategy(strategy_name))
            .strategy_options(
                parallel::StrategyOptions()
                    .optimizer([adam](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), adam); })
                    .group(group))
            .checkpoint(train::CheckpointerOptions()
                            .dir(checkpoint_dir)
                            .format(train::CheckpointFormat::kSharded)
                            .save_every(save_every)
                            .resume(resume))
            .epochs(epochs)
            .batch_size(batch_size)
            .seed(seed)
            .save_model(out);
    train::Trainer trainer(torch::nn::AnyModule(TabularNet()), tabular(samples, seed), options, tabular(256, seed + 1));
    const train::TrainResult r = trainer.fit();
    if (world.rank == 0)
      std::printf("%s on %lld rank(s): %zu epoch(s) trained this run, %lld steps in all; final loss %.4f, held-out "
                  "accuracy %.3f; parameters held by this rank %lld bytes\n",
                  trainer.strategy().name().c_str(), static_cast<long long>(world.world_size), r.epochs.size(),
                  static_cast<long long>(r.steps), r.final_loss, r.test_acc, static_cast<long long>(r.param_bytes));
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "sharded_checkpoints: %s\n", e.what_without_backtrace());
    return 1;
  }
  return 0;
}
