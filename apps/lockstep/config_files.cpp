// Config files and the scheduler's environment as sources of flag values: `lockstep run --config`
// (an accelerate config; PyTorchJob / torchrun PET_* variables) and `lockstep train --deepspeed`.
#include "config_files.h"

#include <c10/util/StringUtil.h>

#include <cstdlib>
#include <iostream>

#include "lockstep/core/world.h"
#include "lockstep/launch/accelerate_config.h"
#include "lockstep/launch/cluster_env.h"

namespace lockstep::cli {
namespace {

// The `lockstep run` flags a config file or the environment may fill, and the field each sets.
struct RunField {
  const char* flag;
  void (*copy)(const launch::LaunchOptions& from, launch::LaunchOptions& to);
};

const RunField kRunFields[] = {
    {"--nproc-per-node", [](const auto& f, auto& t) { t.nproc_per_node(f.nproc_per_node()); }},
    {"--nnodes", [](const auto& f, auto& t) { t.nnodes(f.nnodes()).min_nodes(f.min_nodes()); }},
    {"--node-rank", [](const auto& f, auto& t) { t.node_rank(f.node_rank()); }},
    {"--master-addr", [](const auto& f, auto& t) { t.master_addr(f.master_addr()); }},
    {"--master-port", [](const auto& f, auto& t) { t.master_port(f.master_port()); }},
    {"--max-restarts", [](const auto& f, auto& t) { t.max_restarts(f.max_restarts()); }},
    {"--rdzv-timeout", [](const auto& f, auto& t) { t.rdzv_timeout(f.rdzv_timeout()); }},
};

// The `lockstep train` flags a DeepSpeed config also sets; see Note [DeepSpeed configs].
const std::pair<const char*, bool train::ExplicitTrainValues::*> kTrainFlags[] = {
    {"--batch-size", &train::ExplicitTrainValues::batch_size},
    {"--accum-steps", &train::ExplicitTrainValues::accum_steps},
    {"--strategy", &train::ExplicitTrainValues::strategy},
    {"--precision", &train::ExplicitTrainValues::precision},
    {"--clip-norm", &train::ExplicitTrainValues::clip_norm},
    {"--optimizer", &train::ExplicitTrainValues::optimizer},
    {"--lr", &train::ExplicitTrainValues::lr},
    {"--betas", &train::ExplicitTrainValues::betas},
    {"--eps", &train::ExplicitTrainValues::eps},
    {"--weight-decay", &train::ExplicitTrainValues::weight_decay},
    {"--momentum", &train::ExplicitTrainValues::momentum},
    {"--lr-schedule", &train::ExplicitTrainValues::lr_schedule},
    {"--warmup-steps", &train::ExplicitTrainValues::warmup_steps},
};

void say(const std::string& source, const launch::LaunchSettings& s) {
  if (!s.origins.empty()) std::cerr << "lockstep run: " << source << ": " << c10::Join(", ", s.origins) << "\n";
}

}  // namespace

void add_run_sources(CLI::App* cmd, RunSources& sources) {
  cmd->add_option("--config", sources.config,
                  "An accelerate config (YAML): num_processes (all machines), num_machines, machine_rank, "
                  "main_process_ip/port, and training settings handed to lockstep train; flags given win");
  cmd->add_flag("--strict", sources.strict, "Keys of --config that lockstep does not support are errors, not warnings");
}

launch::LaunchOptions resolve_run_options(const CLI::App& cmd, const launch::LaunchOptions& flags,
                                          const RunSources& sources) {
  // See Note [Where lockstep run's settings come from]: defaults < environment < config < flags.
  launch::LaunchOptions fallback = flags;
  const launch::LaunchSettings env =
      launch::launch_settings_from_env([](const char* name) -> const char* { return std::getenv(name); });
  env.apply_to(fallback);
  if (!sources.config.empty()) {
    const launch::LaunchSettings config = launch::accelerate_launch_settings(
        sources.config, launch::AccelerateConfigOptions().strict(sources.strict));
    config.apply_to(fallback);
    say(sources.config, config);
  }
  say("from the environment", env);
  launch::LaunchOptions resolved = flags;
  for (const RunField& field : kRunFields)
    if (cmd.count(field.flag) == 0) field.copy(fallback, resolved);
  resolved.worker_env(fallback.worker_env());
  return resolved;
}

std::function<void()> add_train_config_options(CLI::App* cmd, const std::shared_ptr<train::TrainOptions>& o) {
  // Training settings `lockstep run --config` hands to its workers (see Note [accelerate configs]);
  // a flag given on the command line wins over its variable.
  const std::pair<const char*, const char*> env_flags[] = {
      {"--strategy", launch::kStrategyEnv},       {"--precision", launch::kPrecisionEnv},
      {"--accum-steps", launch::kAccumStepsEnv},  {"--clip-norm", launch::kClipNormEnv},
      {"--fsdp-min-params", launch::kFsdpMinParamsEnv},
      {"--checkpoint-activations", launch::kCheckpointActivationsEnv}};
  for (const auto& [flag, env] : env_flags) cmd->get_option(flag)->envname(env);
  auto path = std::make_shared<std::string>();
  auto strict = std::make_shared<bool>(false);
  cmd->add_option("--deepspeed", *path,
                  "A DeepSpeed JSON config: batch sizes, zero_optimization.stage, bf16/fp16, gradient_clipping, "
                  "optimizer, scheduler (\"auto\": the flag's value; a flag given explicitly must agree)")
      ->envname(launch::kDeepSpeedConfigEnv);
  cmd->add_flag("--strict", *strict, "Keys of --deepspeed that lockstep does not support are errors, not warnings");
  return [cmd, o, path, strict] {
    if (path->empty()) return;
    train::ExplicitTrainValues given;
    for (const auto& [flag, field] : kTrainFlags) given.*field = cmd->count(flag) > 0;
    const WorldInfo world = world_from_env();
    *o = train::with_deepspeed_config_file(
        *o, *path,
        train::DeepSpeedConfigOptions().world_size(world.world_size).given(given).strict(*strict).reporter(
            world.rank == 0 ? stdio_reporter("lockstep train") : Reporter()));
  };
}

}  // namespace lockstep::cli
