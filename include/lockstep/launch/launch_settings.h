#pragma once

#include <c10/util/Optional.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/core/device.h"
#include "lockstep/launch/launcher.h"

namespace lockstep::launch {

// Note [Where lockstep run's settings come from]
// A node's launch settings can come from four places. Each value is taken from the first of:
//   1. the command line (a flag given explicitly),
//   2. a config file the command line names (an accelerate config, launch/accelerate_config.h),
//   3. the environment a scheduler wrote (a Kubeflow PyTorchJob's PET_* and MASTER_* variables,
//      launch/cluster_env.h),
//   4. LaunchOptions' defaults.
// What is named on the command line, flag or file, is the user's intent for this run; the
// environment is what the pod or job happens to carry. Each field comes whole from one source;
// fields may come from different ones (master_addr from a flag, master_port from the environment).

// The values one source gives; unset fields leave LaunchOptions as they are.
struct LaunchSettings {
  c10::optional<int64_t> nproc_per_node;
  c10::optional<int64_t> nnodes;     // with min_nodes: the most nodes of an elastic job
  c10::optional<int64_t> min_nodes;  // set only for an elastic job (MIN < MAX)
  c10::optional<int64_t> node_rank;
  c10::optional<std::string> master_addr;
  c10::optional<int> master_port;
  c10::optional<int64_t> max_restarts;
  c10::optional<double> rdzv_timeout;  // seconds
  // NAME=VALUE pairs every worker gets, e.g. an accelerate config's precision for `lockstep train`.
  EnvVars worker_env;
  // One entry per value set, saying where it came from ("nnodes 2 from PET_NNODES").
  std::vector<std::string> origins;

  bool empty() const { return origins.empty() && worker_env.empty(); }
  // Writes the set fields into `options` (a worker_env entry replaces one of the same name).
  void apply_to(LaunchOptions& options) const;
};

// The integer `text` spells, all of it ("12"; not "12x", "", or one past int64's range), else
// nullopt: for values read from variables and config files.
c10::optional<int64_t> parse_integer(const std::string& text);

// Workers per node as torchrun spells them: a count (LaunchOptions::validate bounds it), "gpu"
// (one per visible CUDA device; refused when none is), "cpu" (one per core), or "auto" (gpu when
// a device is visible, else cpu). `what` names where `text` came from in the message ("--nproc-per-node",
// "PET_NPROC_PER_NODE"). See Note [The rank's device].
int64_t nproc_per_node_from(const std::string& text, const std::string& what, const VisibleDevices& visible,
                            int64_t cores);

}  // namespace lockstep::launch
