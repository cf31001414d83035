#pragma once

#include <nlohmann/json.hpp>
#include <torch/arg.h>

#include <cstdint>
#include <string>

#include "lockstep/core/report.h"
#include "lockstep/train/options.h"

namespace lockstep::train {

// Note [DeepSpeed configs]
// A DeepSpeed JSON config sets the batch, the ZeRO stage, the precision, clipping, the optimizer
// and its schedule. Each key maps to a TrainOptions value with DeepSpeed's meaning:
//   train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size;
//     any two give the third, all three must agree (DeepSpeed's rule);
//   zero_optimization.stage 0/1/2/3 -> ddp (the default under a launcher) / zero1 / zero2 / fsdp,
//     on several processes (one process shards nothing: the default, local);
//   bf16.enabled, fp16.enabled (loss_scale 0: dynamic) -> precision; gradient_clipping -> clip_norm;
//   optimizer {type Adam|AdamW|SGD, params} -> the optimizer; DeepSpeed's "Adam" is AdamW unless
//     adam_w_mode is false, and its weight_decay defaults to 0;
//   scheduler WarmupLR / WarmupDecayLR / WarmupCosineLR -> linear warmup, cosine decay.
// "auto" takes the value from the command line (or its default), as the Hugging Face Trainer's
// integration fills "auto" from its TrainingArguments. A value given both in the file and on the
// command line must agree; when they differ the run stops naming both (the Trainer's integration
// does the same), since silently preferring either one trains something the user did not ask for.
// Keys lockstep cannot honour (offload, NVMe, 1-bit optimizers, compression, monitors) are
// warnings naming the key and why, or one error listing them all when strict. Communication and
// memory tuning knobs (bucket sizes, overlap_comm, stage3_* prefetching) are accepted and have no
// effect: lockstep's strategies size their own buckets.
// What DeepSpeed would refuse or read otherwise is an error, strict or not, naming the file, the key
// and (for a file) its line: a section lockstep reads of the wrong type ("bf16": true,
// "optimizer": "AdamW"), a key given twice in one object (DeepSpeed refuses it; Python's json alone
// keeps the last), a number beyond a double (1e400), nesting deeper than 100 levels.

// Which TrainOptions values the command line set explicitly; the others are defaults, which a
// config file may replace. See Note [DeepSpeed configs].
struct ExplicitTrainValues {
  bool batch_size = false;
  bool accum_steps = false;
  bool strategy = false;
  bool precision = false;
  bool clip_norm = false;
  bool optimizer = false;
  bool lr = false;
  bool betas = false;
  bool eps = false;
  bool weight_decay = false;
  bool momentum = false;
  bool lr_schedule = false;
  bool warmup_steps = false;
};

struct DeepSpeedConfigOptions {
  TORCH_ARG(int64_t, world_size) = 1;  // processes in the job: train_batch_size counts all of them
  TORCH_ARG(ExplicitTrainValues, given);
  // Unsupported keys are one error (naming them all) instead of warnings.
  TORCH_ARG(bool, strict) = false;
  TORCH_ARG(Reporter, reporter) = stdio_reporter("lockstep train");  // warnings, one line per key
};

// `options` with the DeepSpeed config `config` applied; `source` names it in messages (its path).
// Throws c10::ValueError naming the key, its value and the fix when a value is malformed or a
// section of the wrong type, the batch sizes disagree with each other or the world size, a value
// conflicts with one given explicitly, or strict and a key is unsupported.
TrainOptions with_deepspeed_config(TrainOptions options, const nlohmann::json& config, const std::string& source,
                                   const DeepSpeedConfigOptions& how);

// The same for the JSON file at `path` (comments allowed); throws naming the path (and the key and
// line) when it cannot be read or parsed, or a key is given twice.
TrainOptions with_deepspeed_config_file(TrainOptions options, const std::string& path,
                                        const DeepSpeedConfigOptions& how);

}  // namespace lockstep::train
