#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/data/dataset.h"

namespace lockstep::train {

// Everything `lockstep train` can be told. SGD with momentum 0.9 and batch 100 per process as in the
// Python peer (../shared/peer); lr 0.02 rather than the peer's 0.05, because with normalised inputs
// it takes the convnet past 0.90 test accuracy in 3 epochs (0.05 stays near 0.88).
struct TrainOptions {
  TORCH_ARG(std::string, model) = "convnet";             // convnet | mlp | resnet18
  TORCH_ARG(std::string, data) = "fashion-mnist";        // fashion-mnist | synthetic
  TORCH_ARG(std::string, data_dir) = data::kDefaultFashionMnistDir;
  TORCH_ARG(int64_t, limit) = 0;                         // first N training samples; 0: all
  TORCH_ARG(int64_t, epochs) = 1;
  TORCH_ARG(int64_t, batch_size) = 100;                  // per process
  TORCH_ARG(double, lr) = 0.02;
  TORCH_ARG(double, momentum) = 0.9;
  TORCH_ARG(double, weight_decay) = 0.0;
  TORCH_ARG(uint64_t, seed) = 0;                         // model init and data order
  TORCH_ARG(int64_t, threads) = 0;                       // intra-op threads; 0: default_intra_op_threads()
  TORCH_ARG(std::string, save_model) = "";               // final state dict, readable by torch.load
  TORCH_ARG(bool, progress) = true;                      // progress display on stdout


 public:
  // Throws c10::ValueError naming the first invalid value and what is allowed.
  void validate() const;
};

struct EpochResult {
  int64_t epoch = 0;         // 1-based
  double train_loss = 0.0;   // mean over the epoch's steps
  double test_acc = 0.0;     // fraction of the test split classified correctly
  double train_s = 0.0;      // training time, evaluation excluded
};

struct TrainResult {
  int64_t world_size = 1;
  int64_t rank = 0;
  int64_t threads = 0;
  int64_t samples = 0;          // training samples processed by all ranks, all epochs
  double samples_per_s = 0.0;   // global: all ranks' samples per second
  double train_s = 0.0;         // all epochs' training time, evaluation excluded
  double test_acc = 0.0;        // after the last epoch
  double final_loss = 0.0;      // mean training loss of the last epoch
  double peak_rss_mib = 0.0;
  std::vector<double> step_losses;  // every step's loss, in order
  std::vector<EpochResult> epochs;

  // The one-line summary `lockstep train` prints last:
  // {"world_size":1,"samples_per_s":..,"train_s":..,"test_acc":..,"final_loss":..,"peak_rss_mib":..}
  std::string summary_json() const;
};

// Trains options.model() on options.data(), evaluating on the test split after each epoch.
// Under a launcher (WORLD_SIZE > 1 in the environment: lockstep run, torchrun, mpirun, srun) it
// joins the process group and trains through DistributedDataParallel with a DistributedSampler;
// losses and accuracy are averaged over ranks, and only rank 0 shows progress and writes files.
TrainResult train(const TrainOptions& options);

}  // namespace lockstep::train
