// A pipeline over your model's own list of blocks, through lockstep::train::Trainer: each rank
// runs a stage (consecutive blocks), every batch flows through them as micro-batches on the GPipe
// or 1F1B schedule, and checkpoints hold the whole model as one torch.load-readable file.
//
//   ./build/pipeline_blocks --strategy local                                        # one process, the reference
//   lockstep run --nproc-per-node 2 -- ./build/pipeline_blocks --micro-batches 4    # 2 stages
//   lockstep run --nproc-per-node 2 -- ./build/pipeline_blocks --split 2,4 --schedule 1f1b --checkpoint-dir ckpt
//
// A pipeline changes where the blocks run, not what they compute: the run ends where one process
// with the same batch ends (to rounding).
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <memory>

#include "lockstep/core/names.h"
#include "lockstep/core/world.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/models/classifier.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/pipeline_schedule.h"
#include "lockstep/parallel/strategy_registry.h"
#include "lockstep/train/trainer.h"

using namespace lockstep;

// Sequences of 15 steps x 8 channels -> 5 classes: an input projection, `depth` gated residual
// 1-d convolutions and a pooled head. Its blocks are what a pipeline cuts into stages; the layers
// are registered in block order.
struct GatedConvImpl : torch::nn::Module {
  explicit GatedConvImpl(int64_t channels)
      : conv(register_module("conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(channels, 2 * channels, 3).padding(1)))) {}
  torch::Tensor forward(const torch::Tensor& x) {  // (B, C, T) -> (B, C, T)
    const auto halves = conv(x).chunk(2, 1);
    return x + halves[0] * torch::sigmoid(halves[1]);
  }
  torch::nn::Conv1d conv;
};
TORCH_MODULE(GatedConv);

struct SequenceNetImpl : models::Classifier {
  SequenceNetImpl(int64_t depth, int64_t width) {
    input = register_module("input", torch::nn::Conv1d(torch::nn::Conv1dOptions(8, width, 1)));
    for (int64_t i = 0; i < depth; ++i) layers.push_back(register_module("layer" + std::to_string(i), GatedConv(width)));
    head = register_module("head", torch::nn::Linear(width, 5));
  }
  std::vector<models::Block> blocks() override {
    std::vector<models::Block> out;
    out.push_back({"input", {input.ptr()}, [m = input.ptr()](const torch::Tensor& x) {  // (B, T, 8) -> (B, W, T)
                     return m->forward(x.transpose(1, 2));
                   }});
    for (size_t i = 0; i < layers.size(); ++i)
      out.push_back({"layer" + std::to_string(i), {layers[i].ptr()},
                     [m = layers[i].ptr()](const torch::Tensor& x) { return m->forward(x); }});
    out.push_back({"head", {head.ptr()}, [m = head.ptr()](const torch::Tensor& x) {  // (B, W, T) -> (B, 5)
                     return m->forward(x.mean(2));
                   }});
    return out;
  }
  torch::nn::Conv1d input{nullptr};
  std::vector<GatedConv> layers;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(SequenceNet);

// Random sequences whose class is the one of their first 5 channels with the largest sum over time.
std::shared_ptr<train::TensorData> sequences(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const torch::Tensor x = torch::randn({n, 15, 8}, gen);  // (N, T, C)
  return std::make_shared<train::TensorData>(x, x.sum(1).narrow(1, 0, 5).argmax(1));
}

int main(int argc, char** argv) {
  std::string strategy_name = "pipeline", schedule = "gpipe", checkpoint_dir, resume, out;
  int64_t epochs = 2, batch_size = 32, samples = 512, micro_batches = 4, depth = 4;
  std::vector<int64_t> split;
  CLI::App app("Trains a model of your own blocks as a pipeline of stages, one per rank.");
  app.option_defaults()->always_capture_default();
  app.add_option("--strategy", strategy_name, "pipeline, or local for the one-process reference")
      ->check(CLI::IsMember({"pipeline", "local"}));
  app.add_option("--micro-batches", micro_batches, "pipeline micro-batches per batch")->check(CLI::PositiveNumber);
  app.add_option("--schedule", schedule, "gpipe or 1f1b")->check(CLI::IsMember(parallel::pipeline_schedule_names()));
  app.add_option("--split", split, "blocks per stage, e.g. 2,4 (default: equal parameter counts)")->delimiter(',');
  app.add_option("--depth", depth, "gated convolution blocks between the input and the head")->check(CLI::PositiveNumber);
  app.add_option("--epochs", epochs)->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch_size, "samples per step")->check(CLI::PositiveNumber);
  app.add_option("--samples", samples, "training samples")->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-dir", checkpoint_dir, "save the whole model and optimizer at each epoch's end here");
  app.add_option("--resume", resume, "'latest' in --checkpoint-dir, or a checkpoint file");
  app.add_option("--out", out, "write the trained weights here (rank 0; torch.load reads them)");
  CLI11_PARSE(app, argc, argv);

  try {
    const WorldInfo world = world_from_env();
    std::shared_ptr<dist::ProcessGroup> group;
    if (world.world_size > 1) group = dist::init_process_group();

    torch::manual_seed(0);
    const auto sgd = optim::OptimizerOptions(optim::OptimizerKind::kSGD, 0.05).momentum(0.9);
    auto options =
        train::TrainerOptions()
            .strategy(parallel::parse_strategy(strategy_name))
            .strategy_options(
                parallel::StrategyOptions()
                    .optimizer([sgd](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), sgd); })
                    .group(group)
                    .pipeline(parallel::PipelineOptions()  // stages: one per rank, or one per --split entry
                                  .micro_batches(strategy_name == "pipeline" ? micro_batches : 1)
                                  .schedule(enum_from_name<parallel::PipelineSchedule>(
                                      parallel::pipeline_schedule_names(), schedule, "schedule"))
                                  .split(split)))
            .checkpoint(train::CheckpointerOptions().dir(checkpoint_dir).resume(resume))
            .epochs(epochs)
            .batch_size(batch_size)
            .save_model(out);
    train::Trainer trainer(torch::nn::AnyModule(SequenceNet(depth, 32)), sequences(samples, 1), options,
                           sequences(256, 2));
    const train::TrainResult r = trainer.fit();
    if (world.rank == 0)
      std::printf("%s on %lld rank(s): loss %.4f at the first step, %.4f in the last epoch; held-out accuracy %.3f\n",
                  trainer.strategy().name().c_str(), static_cast<long long>(world.world_size),
                  r.step_losses.empty() ? NAN : r.step_losses.front(), r.final_loss, r.test_acc);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "pipeline_blocks: %s\n", e.what_without_backtrace());
    return 1;
  }
  return 0;
}
