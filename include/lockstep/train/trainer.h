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

  // Checkpoints (see checkpoint.h). Rank 0 writes, every rank waits; a failed write is logged and
  // training goes on with the previous checkpoint intact.
  TORCH_ARG(std::string, checkpoint_dir) = "";           // "" : no checkpoints
  TORCH_ARG(int64_t, save_every) = 0;                    // optimizer steps between saves; 0: epoch ends only
  TORCH_ARG(int64_t, keep_last) = 0;                     // newest checkpoints kept; 0: all
  TORCH_ARG(std::string, resume) = "";                   // checkpoint file, directory, or "latest" (in checkpoint_dir)
  TORCH_ARG(std::string, init_weights) = "";             // state dict file to start from (lockstep or torch.save)

  // The optimizer step: k micro-batches of batch_size (DDP no_sync on all but the last), then
  // clipping by value, then by norm (0: off), then a non-finite check agreed by all ranks.
  TORCH_ARG(int64_t, accum_steps) = 1;
  TORCH_ARG(double, clip_value) = 0.0;
  TORCH_ARG(double, clip_norm) = 0.0;
  TORCH_ARG(int64_t, max_skipped_steps) = 10;            // consecutive non-finite steps before aborting
  TORCH_ARG(int64_t, inject_nan_step) = -1;              // testing: step's loss value (0-based) is NaN on inject_nan_rank
  TORCH_ARG(int64_t, inject_nan_rank) = 0;

  // Learning rate by optimizer step (see lr_schedule.h); lr is scaled by world size x accum_steps
  // first when scale_lr is linear or sqrt.
  TORCH_ARG(std::string, lr_schedule) = "constant";      // constant | step | multistep | cosine
  TORCH_ARG(int64_t, warmup_steps) = 0;
  TORCH_ARG(std::string, scale_lr) = "none";             // none | linear | sqrt
  TORCH_ARG(int64_t, lr_step_size) = 0;                  // step: decay every N optimizer steps
  TORCH_ARG(double, lr_gamma) = 0.1;                     // step, multistep: decay factor
  TORCH_ARG(std::vector<int64_t>, lr_milestones);        // multistep: optimizer steps

  // Mixed precision (see amp/opt_level.h). opt_level "": O0 for fp32, O1 otherwise.
  TORCH_ARG(std::string, precision) = "fp32";            // fp32 | bf16 | fp16
  TORCH_ARG(std::string, opt_level) = "";
  TORCH_ARG(std::string, loss_scale) = "";               // dynamic | none | a number; "": none for bf16,
                                                         // the level's for fp16 (dynamic at O1/O2)
  TORCH_ARG(bool, report_memory) = false;                // every rank prints its memory breakdown

  TORCH_ARG(bool, deterministic) = false;                // LibTorch's deterministic algorithms only
  TORCH_ARG(std::string, log_jsonl) = "";                // one JSON line per logged step and per epoch
  TORCH_ARG(std::string, tensorboard) = "";              // event files here (rank 0)
  TORCH_ARG(int64_t, log_every) = 10;                    // optimizer steps between logged steps
  TORCH_ARG(bool, profile) = false;                      // per-phase step times, printed at the end
  TORCH_ARG(std::string, trace) = "";                    // Chrome trace of the step phases (rank 0)

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
  int64_t steps = 0;            // optimizer steps since the start of training (a resumed run counts on)
  int64_t skipped_steps = 0;    // of those, skipped for a non-finite loss or gradient
  int64_t param_bytes = 0;      // this rank's model parameters
  int64_t grad_bytes = 0;       // their gradients (and the fp32 masters' at O2)
  int64_t optim_bytes = 0;      // optimizer state: momentum buffers, and fp32 master weights at O2
  std::string profile;          // --profile's table, "" without it
  std::vector<double> step_losses;  // every optimizer step's loss (mean over its samples), in order
  std::vector<EpochResult> epochs;

  // The one-line summary `lockstep train` prints last:
  // {"world_size":1,"samples_per_s":..,"train_s":..,"test_acc":..,"final_loss":..,"peak_rss_mib":..,
  //  "param_bytes":..,"grad_bytes":..,"optim_bytes":..,"steps":..,"skipped_steps":..}
  std::string summary_json() const;
};

// Trains options.model() on options.data(), evaluating on the test split after each epoch.
// Under a launcher (WORLD_SIZE > 1 in the environment: lockstep run, torchrun, mpirun, srun) it
// joins the process group and trains through DistributedDataParallel with a DistributedSampler;
// losses and accuracy are averaged over ranks, and only rank 0 shows progress and writes files.
TrainResult train(const TrainOptions& options);

}  // namespace lockstep::train
