#pragma once
// Config files and the scheduler's environment as sources of flag values; see config_files.cpp.

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>

#include "lockstep/launch/launcher.h"
#include "lockstep/train/deepspeed_config.h"

namespace lockstep::cli {

struct RunSources {
  std::string config;  // --config: an accelerate config
  bool strict = false;
};

// Adds --config and --strict to `lockstep run`.
void add_run_sources(CLI::App* cmd, RunSources& sources);

// `flags` (the command line's options) with each flag not given on the command line taken from
// the config file, else the environment. See Note [Where lockstep run's settings come from].
launch::LaunchOptions resolve_run_options(const CLI::App& cmd, const launch::LaunchOptions& flags,
                                          const RunSources& sources);

// Adds --deepspeed and --strict to `lockstep train` and makes the LOCKSTEP_* variables of
// `lockstep run --config` the defaults of their flags. The returned function applies the DeepSpeed
// config to `o` once the command line is parsed. See Note [DeepSpeed configs].
std::function<void()> add_train_config_options(CLI::App* cmd, const std::shared_ptr<train::TrainOptions>& o);

}  // namespace lockstep::cli
