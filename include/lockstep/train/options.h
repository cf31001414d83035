#pragma once

#include <c10/util/Optional.h>
#include <torch/arg.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "lockstep/amp/opt_level.h"
#include "lockstep/core/report.h"
#include "lockstep/data/dataset.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/models/norm_layer.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/strategy_registry.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/lr_schedule.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {

// The closed sets of `lockstep train`'s values; each *_names() lists them once, in enum order (see
// core/names.h).
// kAuto: fp32 or bf16, whichever trains the model faster on this CPU, measured at the start of
// the run (see Note [Choosing the precision by timing it]); elsewhere it counts as bf16.
enum class Precision { kFp32, kBf16, kFp16, kAuto };
const std::vector<std::string>& precision_names();  // fp32, bf16, fp16, auto
enum class DataSource { kFashionMnist, kSynthetic, kFortunes, kText, kImageFolder, kCsv };
// fashion-mnist, synthetic, fortunes, text (the CLI spells it text:FILE), imagefolder, csv
const std::vector<std::string>& data_source_names();
// What a text model learns from an entry: its next tokens, or its category.
enum class TextTask { kLm, kClassify };
const std::vector<std::string>& text_task_names();  // lm, classify
constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// Everything `lockstep train` can be told: the reference model and its data, the process, the
// optimizer and precision as flags name them, and the run itself as a Trainer's options (each
// component's own struct; the CLI binds its flags into them). SGD with momentum 0.9 and batch 100
// per process as in the Python peer (../shared/peer); lr 0.02 rather than the peer's 0.05, because
// with normalised inputs it takes the convnet past 0.90 test accuracy in 3 epochs (0.05 stays near
// 0.88).
struct TrainOptions {
  TORCH_ARG(std::string, model) = "convnet";             // one of models::model_names()
  // A TorchScript file (torch.jit.save in Python) to train instead of `model`, on image data; see
  // Note [TorchScript modules as nn::Modules]. save_torchscript: the trained script written there.
  TORCH_ARG(std::string, model_file) = "";
  TORCH_ARG(std::string, save_torchscript) = "";
  TORCH_ARG(DataSource, data) = DataSource::kFashionMnist;
  TORCH_ARG(std::string, data_dir) = data::kDefaultFashionMnistDir;  // imagefolder: its root
  TORCH_ARG(int64_t, limit) = 0;                         // first N training samples; 0: all

  // Files of the user's (--data imagefolder or csv); see docs/data.md.
  TORCH_ARG(std::string, data_file) = "";                // csv: the file
  TORCH_ARG(std::string, label_column) = "label";        // csv: the column of the class labels
  TORCH_ARG(std::string, transform) = "";                // imagefolder: torchvision transforms; "": ToTensor()
  TORCH_ARG(std::string, val_transform) = "";            // "": transform's evaluation counterpart
  TORCH_ARG(std::string, val_dir) = "";                  // imagefolder: a held-out folder of the same classes
  TORCH_ARG(double, val_split) = 0.0;                    // a seeded held-out fraction of the training files
  TORCH_ARG(bool, skip_bad_samples) = false;             // leave undecodable images out, with a warning

  // Text (--data fortunes or text:FILE, --model gpt-mini); see Note [Text training].
  TORCH_ARG(std::string, text_file) = "";                // text: a file (one entry per line, or '%'
                                                         // separators) or a directory of fortune files
  TORCH_ARG(TextTask, task) = TextTask::kLm;
  TORCH_ARG(std::string, tokenizer) = "";                // tokenizer.json; "": a BPE trained on the training split
  TORCH_ARG(int64_t, vocab_size) = 4000;                 // of that BPE
  TORCH_ARG(std::string, add_tokens) = "";               // a file of tokens to add, one per line
  TORCH_ARG(std::string, init_new_embeddings) = "mean";  // zeros | mean | copy:<token> | mean-of:"<text>"
  TORCH_ARG(int64_t, max_tokens) = 0;                    // per batch and rank, padding counted; 0: --batch-size sequences
  TORCH_ARG(int64_t, sort_size) = 0;                     // sequences sorted together; 0: 1024 x replicas
  TORCH_ARG(int64_t, max_length) = 128;                  // tokens; longer sequences are truncated (the model's context)
  // gpt-mini's size, by GPT2Config's names: blocks, attention heads, model width.
  TORCH_ARG(int64_t, n_layer) = 4;
  TORCH_ARG(int64_t, n_head) = 4;
  TORCH_ARG(int64_t, n_embd) = 256;

  TORCH_ARG(int64_t, threads) = 0;                       // intra-op threads; 0: default_intra_op_threads()
  TORCH_ARG(double, timeout) = 300.0;                    // seconds the rendezvous and each collective may take
  // Ranks on several hosts: how gradients cross them (see Note [Hierarchical all-reduce]).
  TORCH_ARG(dist::AllReduceAlgorithm, allreduce) = dist::AllReduceAlgorithm::kAuto;
  TORCH_ARG(bool, deterministic) = false;                // LibTorch's deterministic algorithms only
  TORCH_ARG(std::string, init_weights) = "";             // state dict file to start from (lockstep or torch.save)
  // The model's BatchNorm layers normalise over the global batch of all ranks (SyncBatchNorm);
  // needs a model with BatchNorm and a launcher.
  TORCH_ARG(bool, sync_bn) = false;

  // The optimizer (kind, betas, eps, weight decay), with PyTorch's defaults; its lr and momentum
  // come from lr and momentum below, whose defaults depend on the kind: lr 0.02 for sgd, 1e-3 for
  // adam and adamw; momentum 0.9 for sgd.
  TORCH_ARG(optim::OptimizerOptions, optimizer) = optim::OptimizerOptions(optim::OptimizerKind::kSGD, 0.0);
  TORCH_ARG(c10::optional<double>, lr) = c10::nullopt;
  TORCH_ARG(c10::optional<double>, momentum) = c10::nullopt;  // sgd; unset: 0.9

  // Mixed precision (see amp/opt_level.h). opt_level unset: O0 for fp32, O1 otherwise.
  TORCH_ARG(Precision, precision) = Precision::kFp32;
  TORCH_ARG(c10::optional<amp::OptLevel>, opt_level) = c10::nullopt;
  TORCH_ARG(std::string, loss_scale) = "";               // dynamic | none | a number; "": none for bf16,
                                                         // the level's for fp16 (dynamic at O1/O2)

  // Learning rate by optimizer step (see lr_schedule.h); its base_lr is the optimizer's lr, scaled
  // by trainer().scale_lr().
  TORCH_ARG(LrScheduleOptions, lr_schedule) = LrScheduleOptions(0.0);

  // Train even when the memory plan predicts a peak above the memory a rank may use (see
  // train/memory_plan.h; train() checks it at start, before the strategy is built).
  TORCH_ARG(bool, ignore_memory_plan) = false;
  // Samples per optimizer step over all ranks, kept whatever the world size by recomputing
  // trainer().accum_steps (accum_steps_for_global_batch); 0: accum_steps as given.
  TORCH_ARG(int64_t, global_batch_size) = 0;

  // The run: epochs, batch size per process, seed (model init and data order), accumulation,
  // the strategy and its options (clipping, pipeline, fsdp, dp's replicas), checkpoints, logs,
  // profiler, progress (on stdout), reports.
  TORCH_ARG(TrainerOptions, trainer) = TrainerOptions().progress(&std::cout);

 public:
  // Throws c10::ValueError naming the first invalid value and what is allowed.
  void validate() const;
  // Throws c10::ValueError naming the option, the path and why, when a file or directory the run
  // would write (--save-model, --trace, --log-jsonl, --checkpoint-dir, --tensorboard) cannot be
  // written there; creates the directories, as the run would. Called on rank 0 before training, so
  // a bad path fails in the first second instead of after the whole run.
  void check_output_paths() const;

  // The values the options leave to the run, resolved once.
  amp::OptLevel resolved_opt_level() const;
  parallel::StrategyKind resolved_strategy(int64_t world_size) const;
  // --loss-scale with its default filled in: bf16 has fp32's exponent range, so its gradients
  // need no scaling (torch.autocast recipes use no GradScaler with bf16); fp16 takes the opt
  // level's default, as in Apex (""). What checkpoints record.
  std::string resolved_loss_scale() const;
  optim::OptimizerOptions optimizer_options() const;
  // How the model builds its norm layers: SyncBatchNorm over `group` with sync_bn (throws naming
  // the fix when `group` is null: one process), BatchNorm2d otherwise.
  models::NormLayer norm_layer(dist::ProcessGroup* group) const;
  // trainer().strategy_options() with what the flags above decide filled in: the optimizer, the
  // precision and loss scaling, and `group`.
  parallel::StrategyOptions strategy_options(std::shared_ptr<dist::ProcessGroup> group) const;
  // Data-parallel replicas of the model on `world_size` ranks: the ranks, or a pipeline's stages together.
  int64_t replicas(int64_t world_size) const;
  // What a checkpoint records of the run and a resumed run must share: model, data, limit, seed,
  // precision, opt_level, loss_scale, optimizer; and world_size, batch_size and accum_steps,
  // which may change (see Note [Resuming on another world size]).
  c10::impl::GenericDict run_settings(int64_t world_size) const;
  bool text() const { return data() == DataSource::kFortunes || data() == DataSource::kText; }
  // The user's files: --data imagefolder or csv.
  bool files() const { return data() == DataSource::kImageFolder || data() == DataSource::kCsv; }
  // What the run trains, as logs and checkpoints record it: `model`, or "torchscript:" and the
  // model file's name.
  std::string model_name() const;
  // The text corpus: kFortunesDir or text_file().
  std::string text_path() const { return data() == DataSource::kFortunes ? kFortunesDir : text_file(); }
};

struct DataSplits {
  data::Dataset train, test;
};

// The training and test splits `options` name: Fashion-MNIST (the first `limit` training
// samples), or seeded synthetic images shaped for the model (`limit` or 10000 for training, 2000
// for test). Throws when the model's input shape does not fit the data.
DataSplits load_data(const TrainOptions& options);

// The gradient-accumulation steps that make `global_batch` samples per optimizer step out of
// micro-batches of `batch_size` on `replicas` data-parallel replicas: global_batch / (batch_size x
// replicas), as DeepSpeed's elasticity keeps train_batch_size when the world size changes. Throws
// c10::ValueError stating the rule and the replica counts that fit when it does not divide.
int64_t accum_steps_for_global_batch(int64_t global_batch, int64_t batch_size, int64_t replicas);

}  // namespace lockstep::train
