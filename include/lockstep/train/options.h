#pragma once

#include <c10/util/Optional.h>
#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/amp/opt_level.h"
#include "lockstep/core/report.h"
#include "lockstep/data/dataset.h"
#include "lockstep/models/norm_layer.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/strategy_registry.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/lr_schedule.h"

namespace lockstep::train {

// The closed sets of `lockstep train`'s values; each *_names() lists them once, in enum order (see
// core/names.h).
enum class Precision { kFp32, kBf16, kFp16 };
const std::vector<std::string>& precision_names();  // fp32, bf16, fp16
enum class DataSource { kFashionMnist, kSynthetic, kFortunes, kText };
// fashion-mnist, synthetic, fortunes, text (the CLI spells the last text:FILE)
const std::vector<std::string>& data_source_names();
// What a text model learns from an entry: its next tokens, or its category.
enum class TextTask { kLm, kClassify };
const std::vector<std::string>& text_task_names();  // lm, classify
constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// Everything `lockstep train` can be told. SGD with momentum 0.9 and batch 100 per process as in the
// Python peer (../shared/peer); lr 0.02 rather than the peer's 0.05, because with normalised inputs
// it takes the convnet past 0.90 test accuracy in 3 epochs (0.05 stays near 0.88).
struct TrainOptions {
  TORCH_ARG(std::string, model) = "convnet";             // one of models::model_names()
  TORCH_ARG(DataSource, data) = DataSource::kFashionMnist;
  TORCH_ARG(std::string, data_dir) = data::kDefaultFashionMnistDir;
  TORCH_ARG(int64_t, limit) = 0;                         // first N training samples; 0: all

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
  TORCH_ARG(int64_t, epochs) = 1;
  TORCH_ARG(int64_t, batch_size) = 100;                  // per process
  TORCH_ARG(uint64_t, seed) = 0;                         // model init and data order
  TORCH_ARG(int64_t, threads) = 0;                       // intra-op threads; 0: default_intra_op_threads()
  TORCH_ARG(double, timeout) = 300.0;                    // seconds the rendezvous and each collective may take
  TORCH_ARG(std::string, save_model) = "";               // final state dict, readable by torch.load
  TORCH_ARG(bool, progress) = true;                      // progress display on stdout
  // unset: ddp under a launcher (WORLD_SIZE > 1), local otherwise.
  TORCH_ARG(c10::optional<parallel::StrategyKind>, strategy) = c10::nullopt;
  // The model's BatchNorm layers normalise over the global batch of all ranks (SyncBatchNorm);
  // needs a model with BatchNorm and a launcher.
  TORCH_ARG(bool, sync_bn) = false;
  // Every block of the model runs under activation checkpointing: its activations are recomputed
  // in backward instead of kept (see Note [Activation checkpointing]).
  TORCH_ARG(bool, checkpoint_activations) = false;
  // --strategy pipeline (see Note [Pipeline strategy]): stages (0: one per rank), pipeline
  // micro-batches per batch, their schedule, and blocks per stage (empty: balanced as `balance` says).
  TORCH_ARG(int64_t, stages) = 0;
  TORCH_ARG(int64_t, micro_batches) = 1;
  TORCH_ARG(parallel::PipelineSchedule, schedule) = parallel::PipelineSchedule::kGPipe;
  TORCH_ARG(std::vector<int64_t>, split);
  TORCH_ARG(parallel::PipelineBalance, balance) = parallel::PipelineBalance::kParams;
  // dp: model replicas, one thread each; 0: the intra-op thread count (--threads), at least 2.
  TORCH_ARG(int64_t, replicas) = 0;
  // --strategy fsdp (see Note [FSDP as a strategy]): blocks joined into units of at least this many
  // parameters (0: one unit per block), and whether units stay gathered from forward to backward.
  TORCH_ARG(int64_t, fsdp_min_params) = 0;
  TORCH_ARG(bool, fsdp_keep_gathered) = false;

  // The optimizer, with PyTorch's defaults except lr (unset: 0.02 for sgd, 1e-3 for adam and
  // adamw) and weight decay (unset: PyTorch's, 0.01 for adamw and 0 otherwise).
  TORCH_ARG(optim::OptimizerKind, optimizer) = optim::OptimizerKind::kSGD;
  TORCH_ARG(c10::optional<double>, lr) = c10::nullopt;
  TORCH_ARG(c10::optional<double>, momentum) = c10::nullopt;  // sgd; unset: 0.9
  TORCH_ARG(double, beta1) = 0.9;                        // adam, adamw
  TORCH_ARG(double, beta2) = 0.999;
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(c10::optional<double>, weight_decay) = c10::nullopt;

  // Checkpoints (see checkpointer.h). Rank 0 writes, every rank waits; a failed write is logged and
  // training goes on with the previous checkpoint intact.
  TORCH_ARG(std::string, checkpoint_dir) = "";           // "" : no checkpoints
  TORCH_ARG(int64_t, save_every) = 0;                    // optimizer steps between saves; 0: epoch ends only
  TORCH_ARG(int64_t, keep_last) = 0;                     // newest checkpoints kept; 0: all
  TORCH_ARG(std::string, resume) = "";                   // checkpoint file, directory, or "latest" (in checkpoint_dir)
  // full: one file gathered on rank 0; sharded: each rank writes its own shards (fsdp, zero1, zero2;
  // see Note [Sharded checkpoint files]).
  TORCH_ARG(CheckpointFormat, checkpoint_format) = CheckpointFormat::kFull;
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
  TORCH_ARG(LrScheduleKind, lr_schedule) = LrScheduleKind::kConstant;
  TORCH_ARG(int64_t, warmup_steps) = 0;
  TORCH_ARG(LrScaleRule, scale_lr) = LrScaleRule::kNone;
  TORCH_ARG(int64_t, lr_step_size) = 0;                  // step: decay every N optimizer steps
  TORCH_ARG(double, lr_gamma) = 0.1;                     // step, multistep: decay factor
  TORCH_ARG(std::vector<int64_t>, lr_milestones);        // multistep: optimizer steps

  // Mixed precision (see amp/opt_level.h). opt_level unset: O0 for fp32, O1 otherwise.
  TORCH_ARG(Precision, precision) = Precision::kFp32;
  TORCH_ARG(c10::optional<amp::OptLevel>, opt_level) = c10::nullopt;
  TORCH_ARG(std::string, loss_scale) = "";               // dynamic | none | a number; "": none for bf16,
                                                         // the level's for fp16 (dynamic at O1/O2)
  TORCH_ARG(bool, report_memory) = false;                // every rank prints its memory breakdown

  TORCH_ARG(bool, deterministic) = false;                // LibTorch's deterministic algorithms only
  TORCH_ARG(std::string, log_jsonl) = "";                // one JSON line per logged step and per epoch
  TORCH_ARG(std::string, tensorboard) = "";              // event files here (rank 0)
  TORCH_ARG(int64_t, log_every) = 10;                    // optimizer steps between logged steps
  TORCH_ARG(bool, profile) = false;                      // per-phase step times, printed at the end
  TORCH_ARG(std::string, trace) = "";                    // Chrome trace of the step phases (rank 0)
  // Epoch lines, skipped steps, memory lines, checkpoint notes and log failures (Note [Reports]).
  TORCH_ARG(Reporter, reporter) = stdio_reporter();

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
  // The strategy's settings (precision, loss scaling, clipping, optimizer), over `group`.
  parallel::StrategyOptions strategy_options(dist::ProcessGroup* group) const;
  // The learning-rate schedule from --lr, unscaled, over the whole run (total_steps 0: the
  // Trainer counts them); the Trainer scales base_lr by --scale-lr.
  LrScheduleOptions lr_schedule_options() const;
  // What a checkpoint records of the run and a resumed run must share: model, data, limit,
  // accum_steps, seed, precision, opt_level, loss_scale, optimizer; and world_size and batch_size,
  // which may change (see Note [Resuming on another world size]).
  c10::impl::GenericDict run_settings(int64_t world_size) const;
  bool text() const { return data() == DataSource::kFortunes || data() == DataSource::kText; }
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

}  // namespace lockstep::train
