// A model written in Python, trained by your C++ program: the TorchScript file Python saved
// (torch.jit.save(torch.jit.script(model), "model.pt")) becomes a torch::nn::Module, a
// lockstep::train::Trainer trains it on Fashion-MNIST under the strategy you choose, and the
// trained module goes back to a TorchScript file that Python's torch.jit.load runs.
//
//   ./build/python_model --model model.pt --out trained.pt                       # one process
//   lockstep run --nproc-per-node 2 -- ./build/python_model --model model.pt --strategy zero2 --out trained.pt
//
// fsdp and pipeline need the module's forward to call its children in order (see Note [Blocks of a
// TorchScript module] in lockstep/models/torchscript_module.h); the other strategies take any
// module whose forward takes and returns one tensor.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <memory>

#include "lockstep/core/world.h"
#include "lockstep/data/dataset.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/models/torchscript_module.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/strategy_registry.h"
#include "lockstep/train/trainer.h"

using namespace lockstep;

// Fashion-MNIST's first `limit` images of `split` (all with 0), normalised, as a TrainingData.
std::shared_ptr<train::TensorData> fashion_mnist(data::Split split, int64_t limit) {
  const data::Dataset d = data::load_fashion_mnist(data::kDefaultFashionMnistDir, split).take(limit);
  auto [images, labels] = d.batch(torch::arange(d.size()));  // (N, 1, 28, 28) float, (N) int64
  return std::make_shared<train::TensorData>(images, labels);
}

int main(int argc, char** argv) {
  std::string model_file, strategy_name = "local", out;
  int64_t batch = 50, epochs = 1, limit = 2000;
  double lr = 0.05;
  CLI::App app("Trains a TorchScript model from Python under a lockstep strategy; start it with `lockstep run` for several ranks.");
  app.option_defaults()->always_capture_default();
  app.add_option("--model", model_file, "the TorchScript file Python saved")->required()->check(CLI::ExistingFile);
  app.add_option("--strategy", strategy_name, "local, dp, ddp, zero1, zero2, fsdp or pipeline")
      ->check(CLI::IsMember(parallel::strategy_names()));
  app.add_option("--batch-size", batch, "samples per step and rank")->check(CLI::PositiveNumber);
  app.add_option("--epochs", epochs, "epochs")->check(CLI::PositiveNumber);
  app.add_option("--limit", limit, "the first N training images (0: all 60000)")->check(CLI::NonNegativeNumber);
  app.add_option("--lr", lr, "SGD learning rate (momentum 0.9)");
  app.add_option("--out", out, "write the trained TorchScript module here (rank 0)");
  CLI11_PARSE(app, argc, argv);

  try {
    const WorldInfo world = world_from_env();
    std::shared_ptr<dist::ProcessGroup> group;  // under a launcher: every rank joins
    if (world.world_size > 1) group = dist::init_process_group();
    const optim::OptimizerOptions sgd = optim::OptimizerOptions(optim::OptimizerKind::kSGD, lr).momentum(0.9);
    auto options =
        train::TrainerOptions()
            .strategy(parallel::parse_strategy(strategy_name))
            .strategy_options(
                parallel::StrategyOptions()
                    .optimizer([sgd](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), sgd); })
                    .group(group)
                    .model_factory([model_file] { return torch::nn::AnyModule(models::TorchScriptModule(model_file)); }))
            .batch_size(batch)
            .epochs(epochs);
    train::Trainer trainer(torch::nn::AnyModule(models::TorchScriptModule(model_file)),
                           fashion_mnist(data::Split::kTrain, limit), options, fashion_mnist(data::Split::kTest, 0));
    const train::TrainResult r = trainer.fit();
    const auto weights = trainer.strategy().model_state_dict();  // every rank: sharded strategies gather
    if (world.rank == 0) {
      if (!out.empty()) models::save_torchscript(model_file, weights, out);
      std::printf("%s on %lld rank(s): loss %.4f at the last step, test accuracy %.4f\n", trainer.strategy().name().c_str(),
                  static_cast<long long>(world.world_size), r.final_loss, r.test_acc);
    }
  } catch (const c10::Error& e) {  // lockstep's errors name the value, the rank and the fix
    std::fprintf(stderr, "python_model: %s\n", e.what_without_backtrace());
    return 1;
  }
  return 0;
}
