// `lockstep train`: trains a reference model and prints one JSON summary line last.
#include <c10/util/StringUtil.h>

#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>

#include "checks.h"
#include "commands.h"
#include "config_files.h"
#include "train_flags.h"
#include "lockstep/core/names.h"
#include "lockstep/core/process.h"
#include "lockstep/models/zoo.h"
#include "lockstep/train/lr_schedule.h"
#include "lockstep/train/train.h"

namespace lockstep::cli {

namespace {

// "S" or "S@R": step S (0-based) on rank R (default 0).
void parse_injection(const std::string& text, train::TrainOptions& o) {
  const auto at = text.find('@');
  bool ok = true;
  try {
    size_t used = 0;
    o.trainer().inject_nan_step(std::stoll(text.substr(0, at), &used));
    ok = used == (at == std::string::npos ? text.size() : at);
    if (at != std::string::npos) {
      o.trainer().inject_nan_rank(std::stoll(text.substr(at + 1), &used));
      ok = ok && used == text.size() - at - 1;
    }
  } catch (const std::logic_error&) {
    ok = false;
  }
  TORCH_CHECK_VALUE(ok, "--inject-nan '", text, "' is not STEP or STEP@RANK (e.g. 5@1)");
}

// --data imagefolder / csv, and the background loader.
void add_file_data_options(CLI::App* cmd, const std::shared_ptr<train::TrainOptions>& o) {
  auto* files = "Your data (--data imagefolder|csv; docs/data.md)";
  cmd->add_option("--data-file", o->data_file(), "csv: the file (a header line, numeric features)")->group(files);
  cmd->add_option("--label-column", o->label_column(), "csv: the column of the class labels")
      ->capture_default_str()->group(files);
  cmd->add_option("--transform", o->transform(),
                  "imagefolder: torchvision transforms as in Python, e.g. \"RandomCrop(28, padding=4), "
                  "RandomHorizontalFlip(), ToTensor(), Normalize((0.5,), (0.5,))\"")
      ->default_str("ToTensor()")->group(files);
  cmd->add_option("--val-transform", o->val_transform(), "imagefolder: transforms of the held-out images")
      ->default_str("--transform without its random steps")->group(files);
  cmd->add_option("--val-dir", o->val_dir(), "imagefolder: held-out images, the same class sub-directories")
      ->group(files);
  cmd->add_option("--val-split", o->val_split(), "Hold out this fraction of the training samples (seeded by --seed)")
      ->group(files);
  cmd->add_flag("--skip-bad-samples", o->skip_bad_samples(),
                "Leave images that cannot be decoded out of their batch, with a warning, instead of failing")
      ->group(files);
  cmd->add_option("--workers", o->trainer().loader().workers(),
                  "Threads that load and transform batches while the step runs (0: on the training thread)")
      ->check(cli::non_negative_count())->capture_default_str()->group(files);
  cmd->add_option("--prefetch", o->trainer().loader().prefetch(), "Batches each worker builds ahead of the step")
      ->check(cli::positive_count())->capture_default_str()->group(files);
}

// Note [Stopping at a step boundary]
// An elastic launcher (`lockstep run --nnodes MIN:MAX`, which sets LOCKSTEP_ELASTIC=1) ends a round
// with SIGTERM when a node arrives, and waits longer than its grace period for the workers to exit.
// Killed mid-step, the workers would lose the steps since the last checkpoint; instead SIGTERM only
// raises a flag, the ranks agree on it after the step that is running (TrainerOptions::
// stop_requested), checkpoint that step and exit with 128 + SIGTERM, and the next round resumes
// from exactly there. Outside an elastic launcher SIGTERM keeps its default: the process ends.
std::atomic<bool> terminate_requested{false};
void request_terminate(int) { terminate_requested.store(true); }

std::function<bool()> stop_on_sigterm() {
  struct sigaction action {};
  action.sa_handler = request_terminate;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, nullptr);
  return [] { return terminate_requested.load(std::memory_order_relaxed); };
}

}  // namespace

// --model, --model-file and --data.
void add_model_options(CLI::App* cmd, const std::shared_ptr<train::TrainOptions>& o) {
  std::vector<std::string> models = models::model_names();
  for (const auto& name : models::text_model_names()) models.push_back(name);
  auto* model = cmd->add_option("--model", o->model(), "Reference model: " + c10::Join(", ", models))
                    ->check(CLI::IsMember(models));
  cmd->add_option("--model-file", o->model_file(),
                  "Train a TorchScript module saved in Python (torch.jit.save of torch.jit.script or trace) on the "
                  "images of --data")
      ->excludes(model);
  cmd->add_option_function<std::string>("--data",
      [o](const std::string& v) {
        try {
          parse_data(v, *o);
        } catch (const c10::ValueError& e) {  // during parsing: a usage error, as CLI11's own
          throw CLI::ValidationError(e.what_without_backtrace());
        }
      },
                                        "Dataset: fashion-mnist, synthetic (seeded random images), fortunes "
                                        "(/usr/share/games/fortunes), text:FILE (one entry per line, or '%' "
                                        "separators), imagefolder (--data-dir) or csv (--data-file)")
      ->default_str("fashion-mnist");
}

// "text:FILE" or one of data_source_names() but "text".
void parse_data(const std::string& text, train::TrainOptions& o) {
  if (text.rfind("text:", 0) == 0) {
    o.data(train::DataSource::kText).text_file(text.substr(5));
    return;
  }
  TORCH_CHECK_VALUE(text != "text", "--data text needs a file: --data text:FILE");
  o.data(enum_from_name<train::DataSource>(train::data_source_names(), text, "--data"));
}

// --data fortunes / text:FILE: tokenizer, task, batching and embedding options.
void add_text_options(CLI::App* cmd, const std::shared_ptr<train::TrainOptions>& o) {
  auto* text = "Text (--model gpt-mini --data fortunes|text:FILE)";
  add_enum_option<train::TextTask>(cmd, "--task", train::text_task_names(), [o](auto v) { o->task(v); },
                                   "lm: next-token prediction, held-out perplexity; classify: the entry's category "
                                   "(the fortune file)", "lm")
      ->group(text);
  cmd->add_option("--tokenizer", o->tokenizer(),
                  "tokenizer.json to tokenise with (default: a BPE trained on the training split, saved beside the "
                  "checkpoints)")
      ->group(text);
  cmd->add_option("--vocab-size", o->vocab_size(), "Vocabulary of the BPE trained without --tokenizer")
      ->check(cli::positive_count())->group(text);
  cmd->add_option("--add-tokens", o->add_tokens(), "Add these tokens (one per line) and resize the embeddings")
      ->group(text);
  cmd->add_option("--init-new-embeddings", o->init_new_embeddings(),
                  "New embedding rows: zeros, mean, copy:<token> or mean-of:\"<text>\"")
      ->group(text);
  cmd->add_option("--max-tokens", o->max_tokens(),
                  "Length-bucketed batches of at most N tokens per rank, padding counted (0: --batch-size sequences)")
      ->check(cli::non_negative_count())->group(text);
  cmd->add_option("--sort-size", o->sort_size(), "Sequences sorted by length together (0: 1024 x world size)")
      ->check(cli::non_negative_count())->group(text);
  cmd->add_option("--max-length", o->max_length(), "Tokens per sequence; longer entries are truncated (the context)")
      ->check(cli::positive_count())->group(text);
  cmd->add_option("--n-layer", o->n_layer(), "gpt-mini: transformer blocks")->check(cli::positive_count())->group(text);
  cmd->add_option("--n-head", o->n_head(), "gpt-mini: attention heads (divide --n-embd)")
      ->check(cli::positive_count())->group(text);
  cmd->add_option("--n-embd", o->n_embd(), "gpt-mini: model width")->check(cli::positive_count())->group(text);
}


Command add_train_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("train", "Train a reference model or a TorchScript file; prints one JSON summary line last");
  cmd->option_defaults()->always_capture_default();
  auto o = std::make_shared<train::TrainOptions>();
  // The flags write into each component's own options (see TrainOptions).
  train::TrainerOptions& t = o->trainer();
  parallel::StrategyOptions& so = t.strategy_options();
  parallel::PipelineOptions& pipeline = so.pipeline();
  train::CheckpointerOptions& checkpoint = t.checkpoint();
  train::LrScheduleOptions& schedule = o->lr_schedule();
  auto quiet = std::make_shared<bool>(false);

  add_model_options(cmd, o);
  add_enum_option<parallel::StrategyKind>(cmd, "--strategy", parallel::strategy_names(), [o](auto v) { o->trainer().strategy(v); },
                                          "How ranks hold and step the model", "ddp under a launcher, else local");
  cmd->add_option("--replicas", so.replicas(),
                  "dp: model replicas, one thread each (0: the intra-op thread count, at least 2)")
      ->check(cli::non_negative_count());
  cmd->add_flag("--sync-bn", o->sync_bn(),
                "SyncBatchNorm: BatchNorm statistics over the global batch of all ranks (needs a launcher)");
  cmd->add_flag("--checkpoint-activations", t.checkpoint_activations(),
                "Recompute each block's activations in backward instead of keeping them (less memory, one more "
                "forward)");
  cmd->add_option("--data-dir", o->data_dir(),
                  "Directory with the Fashion-MNIST IDX files; imagefolder: one sub-directory of images per class");
  add_file_data_options(cmd, o);
  cmd->add_option("--limit", o->limit(), "Use only the first N training samples (0: all)")
      ->check(cli::non_negative_count());
  cmd->add_option("--epochs", t.epochs(), "Epochs to train")->check(cli::positive_count());
  cmd->add_option("--batch-size", t.batch_size(), "Samples per step, per process")
      ->check(cli::positive_count());
  add_text_options(cmd, o);
  auto* opt = "Optimizer";
  add_enum_option<optim::OptimizerKind>(cmd, "--optimizer", optim::optimizer_names(), [o](auto v) { o->optimizer().kind(v); },
                                        "Optimizer, with PyTorch's defaults", "sgd")
      ->group(opt);
  cmd->add_option_function<double>("--lr", [o](double v) { o->lr(v); }, "Learning rate")
      ->default_str("0.02 for sgd, 0.001 for adam and adamw")->check(cli::non_negative_number())->group(opt);
  cmd->add_option_function<double>("--momentum", [o](double v) { o->momentum(v); }, "sgd momentum")
      ->default_str("0.9")->check(cli::non_negative_number())->group(opt);
  auto betas = std::make_shared<std::vector<double>>();
  cmd->add_option("--betas", *betas, "adam, adamw: beta1,beta2 (default 0.9,0.999)")->delimiter(',')->expected(2)
      ->group(opt);
  cmd->add_option("--eps", o->optimizer().eps(), "adam, adamw: term added to the denominator")->check(cli::positive_number())->group(opt);
  cmd->add_option_function<double>("--weight-decay", [o](double v) { o->optimizer().weight_decay(v); },
                                    "Weight decay (adamw: decoupled)")
      ->default_str("0.01 for adamw, 0 otherwise")->check(cli::non_negative_number())->group(opt);
  cmd->add_option("--seed", t.seed(), "Seed for initialisation and data order");
  cmd->add_option("--threads", o->threads(),
                  "Intra-op threads (0: the cores this process may use / the processes on this node)")
      ->check(cli::non_negative_count());
  cmd->add_option("--timeout", o->timeout(),
                  "Seconds the rendezvous and each collective may take before the run fails naming the rank that "
                  "did not arrive")
      ->check(cli::positive_number())->capture_default_str();
  add_enum_option<dist::AllReduceAlgorithm>(
      cmd, "--allreduce", dist::all_reduce_algorithm_names(), [o](auto v) { o->allreduce(v); },
      "Ranks on several hosts: flat (one Gloo ring), hierarchical (shared memory inside each host, one shard per "
      "rank across hosts), or auto: hierarchical when every host has the same number of ranks, at least 2 "
      "(LOCKSTEP_ALLREDUCE sets auto's choice)",
      "auto");
  cmd->add_option("--save-model", t.save_model(),
                  "Write the final state dict here (readable by Python's torch.load)");
  cmd->add_option("--save-torchscript", o->save_torchscript(),
                  "--model-file: write the TorchScript module with the trained weights here (Python's torch.jit.load)");
  cmd->add_flag("--quiet", *quiet, "No progress display (the JSON summary is still printed)");
  cmd->add_flag("--deterministic", o->deterministic(), "Use only LibTorch's deterministic algorithms");
  cmd->add_option("--log-jsonl", t.log().jsonl(), "Write one JSON line per logged step and per epoch to FILE (appended to when resuming)");
  cmd->add_option("--log-every", t.log_every(), "Optimizer steps between logged steps")->check(cli::positive_count());

  cmd->add_option("--tensorboard", t.log().tensorboard(), "Write TensorBoard event files (scalars) to DIR");
  cmd->add_flag("--profile", t.profile(), "Print each step phase's mean time and share of the step at the end");
  cmd->add_option("--trace", t.trace(), "Write the step phases as a Chrome trace (chrome://tracing, Perfetto)");

  auto* lr = "Learning rate";
  add_enum_option<train::LrScheduleKind>(cmd, "--lr-schedule", train::lr_schedule_names(),
                                         [o](auto v) { o->lr_schedule().kind(v); }, "Learning-rate schedule by optimizer step",
                                         "constant")
      ->group(lr);
  cmd->add_option("--warmup-steps", schedule.warmup_steps(), "Linear warmup over the first N optimizer steps")
      ->check(cli::non_negative_count())->group(lr);
  add_enum_option<train::LrScaleRule>(cmd, "--scale-lr", train::lr_scale_rule_names(), [o](auto v) { o->trainer().scale_lr(v); },
                                      "Scale --lr by world size x accum steps", "none")
      ->group(lr);
  cmd->add_option("--lr-step-size", schedule.step_size(), "step schedule: decay every N optimizer steps")
      ->check(cli::non_negative_count())->group(lr);
  cmd->add_option("--lr-gamma", schedule.gamma(), "step and multistep schedules: decay factor")->group(lr);
  cmd->add_option("--lr-milestones", schedule.milestones(), "multistep schedule: optimizer steps at which to decay")
      ->delimiter(',')->group(lr);

  auto* mp = "Mixed precision";
  add_enum_option<train::Precision>(cmd, "--precision", train::precision_names(), [o](auto v) { o->precision(v); },
                                    "Training precision", "fp32")
      ->group(mp);
  add_enum_option<amp::OptLevel>(cmd, "--opt-level", amp::opt_level_names(), [o](auto v) { o->opt_level(v); },
                                 "Apex opt level", "O0 for fp32, O1 otherwise")
      ->group(mp);
  cmd->add_option("--loss-scale", o->loss_scale(), "dynamic, none or a fixed number (default: none for bf16; for fp16 dynamic at O1/O2)")
      ->group(mp);
  cmd->add_flag("--report-memory", t.report_memory(), "Every rank prints its parameter, gradient and optimizer bytes")
      ->group(mp);
  cmd->add_flag("--ignore-memory-plan", o->ignore_memory_plan(),
                "Train even when the memory plan (lockstep plan) predicts a peak above the memory a rank may use")
      ->group(mp);

  auto* pipe = "Pipeline (--strategy pipeline)";
  cmd->add_option("--stages", pipeline.stages(), "Pipeline stages, one per rank (default: the world size)")
      ->check(cli::non_negative_count())->group(pipe);
  cmd->add_option("--micro-batches", pipeline.micro_batches(), "Pipeline micro-batches each batch is split into")
      ->check(cli::positive_count())->group(pipe);
  add_enum_option<parallel::PipelineSchedule>(cmd, "--schedule", parallel::pipeline_schedule_names(),
                                              [o](auto v) { o->trainer().strategy_options().pipeline().schedule(v); },
                                              "gpipe: all forwards, then all backwards; 1f1b: one forward, one "
                                              "backward (fewer activations alive)", "gpipe")
      ->group(pipe);
  cmd->add_option("--split", pipeline.split(), "Blocks per stage, e.g. 6,4 (default: balanced as --balance says)")
      ->delimiter(',')->group(pipe);
  add_enum_option<parallel::PipelineBalance>(cmd, "--balance", parallel::pipeline_balance_names(),
                                             [o](auto v) { o->trainer().strategy_options().pipeline().balance(v); },
                                             "Cut stages with equal parameter counts, or equal measured forward + "
                                             "backward time", "params")
      ->group(pipe);

  auto* fsdp = "FSDP (--strategy fsdp)";
  cmd->add_option("--fsdp-min-params", so.fsdp().min_params(),
                  "Join consecutive blocks into units of at least N parameters (0: one unit per block)")
      ->check(cli::non_negative_count())->group(fsdp);
  cmd->add_flag_callback("--fsdp-no-reshard-after-forward",
                         [o] { o->trainer().strategy_options().fsdp().reshard_after_forward(false); },
                "Keep each unit's gathered parameters from its forward to its backward (one all-gather less per "
                "unit, more memory)")
      ->group(fsdp);
  cmd->add_flag_callback("--fsdp-no-prefetch", [o] { o->trainer().strategy_options().fsdp().prefetch(false); },
                         "Gather each unit only when it runs, not during the unit before it (one unit gathered at a "
                         "time instead of two; slower)")
      ->group(fsdp);

  auto* ckpt = "Checkpoints";
  cmd->add_option("--checkpoint-dir", checkpoint.dir(), "Write checkpoints (step-N.pt) here, at each epoch end")
      ->group(ckpt);
  cmd->add_option("--save-every", checkpoint.save_every(), "Also checkpoint every N optimizer steps (0: epoch ends only)")
      ->check(cli::non_negative_count())->group(ckpt);
  cmd->add_option("--keep-last", checkpoint.keep_last(), "Keep only the newest K checkpoints (0: all)")
      ->check(cli::non_negative_count())->group(ckpt);
  add_enum_option<train::CheckpointFormat>(cmd, "--checkpoint-format", train::checkpoint_format_names(),
                                           [o](auto v) { o->trainer().checkpoint().format(v); },
                                           "full: one torch.load-readable file gathered on rank 0 (step-N.pt); "
                                           "sharded: each rank writes its own shards, nothing gathered "
                                           "(step-N/rank-R-of-W.pt + metadata.pt; fsdp, zero1, zero2)", "full")
      ->group(ckpt);
  cmd->add_option("--resume", checkpoint.resume(),
                  "Continue from a checkpoint file, the newest in a directory, or 'latest' in --checkpoint-dir")
      ->group(ckpt);
  cmd->add_option("--init-weights", o->init_weights(),
                  "Start from a state dict (--save-model or Python's torch.save(model.state_dict()))")
      ->group(ckpt);

  auto* step = "Optimizer step";
  cmd->add_option("--global-batch-size", o->global_batch_size(),
                  "Samples per optimizer step over all ranks, kept at any world size by recomputing --accum-steps "
                  "(global = --batch-size x accum steps x replicas; 0: off)")
      ->check(cli::non_negative_count())->group(step);
  cmd->add_option("--accum-steps", t.accum_steps(), "Micro-batches per optimizer step (gradient accumulation)")
      ->check(cli::positive_count())->group(step);
  cmd->add_option("--clip-value", so.clip_value(), "Clamp each gradient element to [-V, V] (0: off)")
      ->check(cli::non_negative_number())->group(step);
  cmd->add_option("--clip-norm", so.clip_norm(), "Scale gradients to total L2 norm at most N, after --clip-value (0: off)")
      ->check(cli::non_negative_number())->group(step);
  cmd->add_option("--max-skipped-steps", t.max_skipped_steps(),
                  "Abort after this many consecutive steps with a non-finite loss or gradient")
      ->check(cli::positive_count())->group(step);
  auto inject = std::make_shared<std::string>();
  cmd->add_option("--inject-nan", *inject, "Testing: make step S's loss NaN on rank R (S or S@R, S 0-based)")
      ->group(step);

  auto apply_config_files = add_train_config_options(cmd, o);

  return {cmd, [o, quiet, inject, betas, apply_config_files] {
            if (!inject->empty()) parse_injection(*inject, *o);
            if (!betas->empty()) o->optimizer().beta1((*betas)[0]).beta2((*betas)[1]);
            apply_config_files();
            if (*quiet) o->trainer().progress(nullptr);
            const char* elastic = std::getenv("LOCKSTEP_ELASTIC");
            if (elastic != nullptr && std::string(elastic) == "1") o->trainer().stop_requested(stop_on_sigterm());
            auto result = train::train(*o);
            if (result.stopped) {
              if (result.rank == 0)
                std::cerr << "lockstep train: stopped by SIGTERM after step " << result.steps
                          << (o->trainer().checkpoint().dir().empty() ? " (no --checkpoint-dir: nothing was saved)"
                                                                      : ", which the newest checkpoint holds")
                          << std::endl;
              return 128 + SIGTERM;
            }
            if (result.rank == 0) std::cout << result.profile << result.summary_json() << std::endl;
            return 0;
          },
          train_wording({{"TrainOptions::ignore_memory_plan", "--ignore-memory-plan"},
                         {"under a launcher", "under a launcher (lockstep run --nproc-per-node N -- lockstep train ...)"}})};
}

Wording train_wording(Wording more) {
  Wording w{{"PipelineOptions::stages", "--stages"},
            {"PipelineOptions::split", "--split"},
            {"PipelineOptions::micro_batches", "--micro-batches"},
            {"FsdpOptions::min_params", "--fsdp-min-params"},
            {"StrategyOptions::opt_level", "--opt-level"},
            {"TrainerOptions::checkpoint_activations", "--checkpoint-activations"}};
  w.insert(w.end(), more.begin(), more.end());
  return w;
}

}  // namespace lockstep::cli
