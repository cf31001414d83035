// A complete data-parallel training program to copy: swap in your model and data, keep the loop.
//
//   lockstep run --nproc-per-node 2 -- ./build/ddp_train --epochs 3
//   lockstep run --nproc-per-node 2 -- ./build/ddp_train --epochs 5 --resume checkpoint.pt
//
// `lockstep run` starts one copy of this program per rank. Each copy holds a whole replica of the
// model and trains on its own share of every epoch; DDP averages the gradients during backward, so
// every replica takes the same optimizer step and the replicas never drift apart.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>

#include "lockstep/amp/autocast.h"
#include "lockstep/amp/grad_scaler.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/heap.h"
#include "lockstep/core/torch_load.h"
#include "lockstep/core/torch_save.h"
#include "lockstep/data/dataset.h"
#include "lockstep/data/distributed_sampler.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/zoo.h"
#include "lockstep/optim/state_dict.h"
#include "lockstep/parallel/distributed_data_parallel.h"

using namespace lockstep;

int main(int argc, char** argv) {
  int64_t epochs = 3, batch_size = 50, limit = 0, seed = 0;
  double lr = 0.02;
  std::string data_dir = data::kDefaultFashionMnistDir, checkpoint = "checkpoint.pt", resume;
  CLI::App app("Trains a convnet with DDP and bf16 autocast; start it with `lockstep run`.");
  app.option_defaults()->always_capture_default();  // --help shows the defaults
  app.add_option("--epochs", epochs, "epochs in total, those of a resumed checkpoint included");
  app.add_option("--batch-size", batch_size, "samples per step on each rank")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "SGD learning rate (momentum 0.9)");
  app.add_option("--limit", limit, "train on the first N samples only (0: all)");
  app.add_option("--data-dir", data_dir, "Fashion-MNIST; when absent, synthetic data");
  app.add_option("--checkpoint", checkpoint, "written by rank 0 after every epoch");
  app.add_option("--resume", resume, "a checkpoint to continue from");
  app.add_option("--seed", seed, "initial weights and data order");
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // whole lines reach `lockstep run` as they are printed

  try {
    configure_heap();  // See Note [Keeping freed memory for the next step]
    auto group = dist::init_process_group();  // RANK, WORLD_SIZE, MASTER_* as `lockstep run` set them
    const bool rank0 = group->rank() == 0;
    const bool real_data = std::filesystem::exists(data_dir);
    const data::Dataset train = (real_data ? data::load_fashion_mnist(data_dir, data::Split::kTrain)
                                           : data::make_synthetic(data::SyntheticOptions())).take(limit);

    torch::manual_seed(seed);
    auto model = models::make_model("convnet", train.num_classes);  // (B, 1, 28, 28) -> (B, 10)
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
    // bf16 keeps fp32's exponent range, so its gradients do not underflow and PyTorch users often
    // run bf16 without a scaler. We keep one: scaling by a power of two costs no bf16 precision,
    // and with the group it makes every rank skip a step together when any rank sees an inf/NaN
    // gradient. GradScalerOptions().enabled(false) turns it into a no-op; the loop stays the same.
    amp::GradScaler scaler(amp::GradScalerOptions().group(group.get()));
    int64_t start_epoch = 0;
    if (!resume.empty()) {  // every rank reads the file: on several nodes, put it where all see it
      const auto saved = torch_load(read_file(resume)).toGenericDict();
      models::load_state_dict(*model, saved.at("model"), resume);
      optim::load_optimizer_state_dict(optimizer, saved.at("optimizer"), resume);
      scaler.load_state_dict(saved.at("scaler").toGenericDict());
      start_epoch = saved.at("epoch").toInt();
    }
    parallel::DistributedDataParallel ddp(model, *group);  // checks and takes rank 0's weights
    // Each epoch a fresh shuffle, the same on every rank, dealt out rank by rank: together the
    // ranks see every sample once, and each sees as many as the others (so they step together).
    data::DistributedSampler sampler(train.size(), data::DistributedSamplerOptions()
        .num_replicas(group->size()).rank(group->rank()).seed(static_cast<uint64_t>(seed)));
    if (rank0)
      std::cout << "world size " << group->size() << ", " << train.size()
                << (real_data ? " Fashion-MNIST" : " synthetic") << " samples, batch " << batch_size
                << " per rank, bf16 autocast, from epoch " << start_epoch + 1 << "\n";

    for (int64_t epoch = start_epoch; epoch < epochs; ++epoch) {
      const auto start = std::chrono::steady_clock::now();
      sampler.set_epoch(epoch);
      const torch::Tensor order = sampler.indices();  // int64 (num_samples), this rank's share
      double first_loss = 0, loss_sum = 0;
      int64_t steps = 0;
      for (int64_t i = 0; i < order.size(0); i += batch_size, ++steps) {
        auto [x, y] = train.batch(order.slice(0, i, i + batch_size));  // x float (B, 1, 28, 28), y (B)
        optimizer.zero_grad();
        torch::Tensor loss;
        {
          amp::AutocastGuard autocast;  // convs and the linear layer run in bf16, the loss in fp32
          loss = torch::nn::functional::cross_entropy(ddp.forward(x), y);
        }
        scaler.scale(loss).backward();  // gradient buckets are all-reduced while backward runs
        scaler.step(optimizer);         // unscales; skipped on all ranks if any gradient is inf/NaN
        scaler.update();
        loss_sum += loss.item<double>();
        if (steps == 0) first_loss = loss.item<double>();
      }
      // Collectives: every rank calls them, even though only rank 0 prints.
      first_loss = group->average(first_loss);
      const double mean_loss = group->average(loss_sum / static_cast<double>(steps));
      if (rank0) {
        // The weights and the optimizer's state (state dicts Python's load_state_dict methods take),
        // the scaler and the epochs done. Written atomically: a crash mid-write leaves the previous file intact.
        c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
        state.insert("model", models::state_dict_to_dict(*model));
        state.insert("optimizer", optim::optimizer_state_dict(optimizer));
        state.insert("scaler", scaler.state_dict());
        state.insert("epoch", epoch + 1);
        write_file_atomic(checkpoint, torch_save(state));
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
        std::cout << std::fixed << std::setprecision(4) << "epoch " << epoch + 1 << "/" << epochs << ": loss "
                  << first_loss << " at the first step, " << mean_loss << " mean, " << std::setprecision(1)
                  << took.count() << " s, saved " << checkpoint << "\n";
      }
    }
  } catch (const c10::Error& e) {
    std::cerr << "ddp_train: " << e.what_without_backtrace() << "\n";
    return 1;
  }
}
