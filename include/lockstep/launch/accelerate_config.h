#pragma once

#include <torch/arg.h>

#include <string>

#include "lockstep/core/report.h"
#include "lockstep/launch/launch_settings.h"

namespace lockstep::launch {

// Note [accelerate configs]
// An accelerate config (`accelerate config`'s default_config.yaml, or a template from a project's
// repository) describes a launch and a training setup in one file. Its launch keys become
// `lockstep run` settings with accelerate's meanings: num_processes is the total over all machines
// (each node starts num_processes / num_machines workers), num_machines the nodes, machine_rank
// this node, main_process_ip/port node 0's address and the workers' port. Its training keys
// (distributed_type with fsdp_config or deepspeed_config, mixed_precision, accumulation, clipping)
// go to the workers as LOCKSTEP_* variables, which `lockstep train` reads as the defaults of its
// flags, as accelerate hands ACCELERATE_* variables to the script it launches. Keys that ask for
// what lockstep does not do (offload, NVMe, fp8, TPUs, torch.compile, SageMaker) are warnings
// naming the key and why, or errors when strict. What accelerate would read otherwise is an error,
// strict or not: a key given twice in one mapping (PyYAML keeps the last, a lookup finds the
// first), a value over 4096 bytes (a path's limit), a main_process_ip over 253 bytes (a host
// name's), a main_process_port with no free port above it (the launchers use port + 1).

// The variables `lockstep train` reads as its flags' defaults; see Note [accelerate configs].
constexpr const char* kStrategyEnv = "LOCKSTEP_STRATEGY";            // a parallel::strategy_names() name
constexpr const char* kPrecisionEnv = "LOCKSTEP_PRECISION";          // fp32, bf16, fp16
constexpr const char* kAccumStepsEnv = "LOCKSTEP_ACCUM_STEPS";       // micro-batches per step
constexpr const char* kClipNormEnv = "LOCKSTEP_CLIP_NORM";           // max total L2 norm
constexpr const char* kDeepSpeedConfigEnv = "LOCKSTEP_DEEPSPEED";    // a DeepSpeed JSON file
constexpr const char* kCheckpointActivationsEnv = "LOCKSTEP_CHECKPOINT_ACTIVATIONS";  // "true"
constexpr const char* kFsdpMinParamsEnv = "LOCKSTEP_FSDP_MIN_PARAMS";  // parameters per FSDP unit

struct AccelerateConfigOptions {
  // Unsupported keys are errors (all of them named in one message) instead of warnings.
  TORCH_ARG(bool, strict) = false;
  // Where warnings go (one line per key); see Note [Reports].
  TORCH_ARG(Reporter, reporter) = stdio_reporter("lockstep run");
};

// The launch settings of the accelerate config (YAML, or JSON) at `path`. Throws c10::ValueError
// naming the file, the key and its value (and the line, where the value is read) when a value is
// malformed (num_processes not divisible by num_machines, a distributed_type accelerate does not
// have), a key is given twice, a value is too long, or when strict and a key is not supported.
LaunchSettings accelerate_launch_settings(const std::string& path,
                                          const AccelerateConfigOptions& options = AccelerateConfigOptions());

}  // namespace lockstep::launch
