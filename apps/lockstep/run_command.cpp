// `lockstep run`: the launcher. Starts PROGRAM once per rank and supervises the group.
#include <c10/util/Logging.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "commands.h"
#include "config_files.h"
#include "lockstep/core/device.h"
#include "lockstep/core/process.h"
#include "lockstep/launch/launch_settings.h"
#include "lockstep/launch/launcher.h"

namespace lockstep::cli {

Command add_run_command(CLI::App& app, const std::optional<std::vector<std::string>>& program_tail) {
  CLI::App* cmd = app.add_subcommand(
      "run", "Start PROGRAM once per rank (torchrun for C++): lockstep run [OPTIONS] -- PROGRAM [ARGS...]");
  cmd->option_defaults()->always_capture_default();
  auto o = std::make_shared<launch::LaunchOptions>();

  cmd->add_option_function<std::string>(
         "--nproc-per-node",
         [o](const std::string& text) {
           o->nproc_per_node(launch::nproc_per_node_from(text, "--nproc-per-node", VisibleDevices::probe(),
                                                         available_cores()));
         },
         "Workers to start on this node: a number, gpu (one per visible CUDA device), cpu (one per core), or "
         "auto (gpu when a device is visible, else cpu)")
      ->default_str("1");
  cmd->add_option_function<std::string>(
         "--nnodes", [o](const std::string& text) { o->parse_nnodes(text); },
         "Nodes in the job (run this command on each), or MIN:MAX for an elastic job that goes on while at "
         "least MIN remain and takes in nodes that arrive, up to MAX")
      ->default_str("1");
  cmd->add_option("--node-rank", o->node_rank(), "This node's rank, in [0, nnodes) (not for an elastic job)");
  cmd->add_option("--rdzv-endpoint", o->rdzv_endpoint(),
                  "Elastic: HOST[:PORT],... of launchers of the job (any reachable one lets a node in; default: "
                  "--master-addr, on --master-port + 1)");
  cmd->add_option("--rdzv-id", o->rdzv_id(),
                  "The job's id, the same on every node (default: derived from PROGRAM [ARGS...] and the config, "
                  "so nodes given one command are one job); a node of another id is refused");
  cmd->add_option("--rdzv-last-call", o->rdzv_last_call(),
                  "Elastic: seconds a round waits for more nodes once MIN have arrived");
  cmd->add_option("--master-addr", o->master_addr(), "Address of node 0, reachable from every node");
  cmd->add_option("--master-port", o->master_port(),
                  "Workers' MASTER_PORT; the launchers meet on the next port (0: a free port on one "
                  "node, 29500 on several)");
  cmd->add_flag("--standalone", o->standalone(),
                "One node on this host with a free port (the default when --nnodes is 1)");
  cmd->add_option("--rdzv-timeout", o->rdzv_timeout(), "Seconds to wait for every node to join");
  cmd->add_option("--max-restarts", o->max_restarts(), "Restarts of the whole group after a failure");
  cmd->add_option("--log-dir", o->log_dir(),
                  "Also write each rank's output to DIR/attempt_K/rank_N.stdout and .stderr");
  cmd->add_option("--grace-period", o->grace_period(),
                  "Seconds between SIGTERM and SIGKILL when stopping workers");
  cmd->add_option("--heartbeat-timeout", o->heartbeat_timeout(),
                  "Seconds another node's launcher may stay silent before its node is declared failed");
  cmd->add_option("--iface", o->iface(),
                  "Network interfaces the workers' Gloo binds, comma-separated (sets LOCKSTEP_SOCKET_IFNAME; "
                  "GLOO_SOCKET_IFNAME is read too)");
  auto sources = std::make_shared<RunSources>();
  add_run_sources(cmd, *sources);
  // Only for `lockstep run PROGRAM` without "--"; after "--", main() hands over the words untouched.
  cmd->add_option("program", o->program(), "PROGRAM [ARGS...], after --");

  return {cmd, [cmd, o, sources, program_tail] {
            // Words before "--" (if any) came through CLI11; a "--" after them was meant for them.
            if (program_tail) {
              if (!o->program().empty()) o->program().push_back("--");
              o->program().insert(o->program().end(), program_tail->begin(), program_tail->end());
            }
            // c10d logs each failed store connection as a warning with a C++ backtrace; the launcher
            // reports what failed itself, in one line. TORCH_CPP_LOG_LEVEL, when set, decides.
            if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr)
              FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, int{c10::GLOG_ERROR});
            return launch::Launcher(resolve_run_options(*cmd, *o, *sources)).run();
          }};
}

}  // namespace lockstep::cli
