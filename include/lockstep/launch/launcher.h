#pragma once

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/core/report.h"
#include "lockstep/launch/rendezvous.h"

namespace lockstep::launch {

// Everything `lockstep run` can be told; the CLI options carry the same names.
struct LaunchOptions {
  LaunchOptions() = default;
  explicit LaunchOptions(std::vector<std::string> program) : program_(std::move(program)) {}

  TORCH_ARG(std::vector<std::string>, program);  // PROGRAM [ARGS...]
  TORCH_ARG(int64_t, nproc_per_node) = 1;
  TORCH_ARG(int64_t, nnodes) = 1;  // with min_nodes: the most nodes (MAX of --nnodes MIN:MAX)
  // The fewest nodes of an elastic job (MIN of --nnodes MIN:MAX); 0: membership is fixed at nnodes.
  // See Note [Elastic rendezvous without a single point of failure].
  TORCH_ARG(int64_t, min_nodes) = 0;
  TORCH_ARG(int64_t, node_rank) = 0;  // fixed membership only; an elastic job assigns them
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  // 0: a free port with one node, 29500 (PyTorch's default) with several.
  // See Note [Launcher rendezvous port]: the launchers also use master_port + 1.
  TORCH_ARG(int, master_port) = 0;
  // One node on this host with a free port; the default when nnodes is 1 and no port is given.
  TORCH_ARG(bool, standalone) = false;
  TORCH_ARG(double, rdzv_timeout) = 300.0;  // seconds to wait for every node to join a round
  // The job's id (torchrun's --rdzv-id); empty: derived from the program and worker_env, so that
  // nodes given the same command are one job. See Note [Nodes agree on the job].
  TORCH_ARG(std::string, rdzv_id) = "";
  // Elastic: HOST:PORT of launchers of the job, comma-separated (empty: master_addr and
  // master_port + 1); each launcher's own rendezvous store listens on that port.
  TORCH_ARG(std::string, rdzv_endpoint) = "";
  // Elastic: seconds a round stays open for more nodes once MIN have arrived.
  TORCH_ARG(double, rdzv_last_call) = 2.0;
  TORCH_ARG(int64_t, max_restarts) = 0;     // restarts of the whole group after a failure
  TORCH_ARG(std::string, log_dir) = "";     // also write DIR/attempt_K/rank_N.{stdout,stderr}
  TORCH_ARG(double, grace_period) = 5.0;    // seconds between SIGTERM and SIGKILL when stopping
  // Seconds another node's launcher may stay silent before its node is declared failed.
  // See Note [Launcher heartbeats].
  TORCH_ARG(double, heartbeat_timeout) = 30.0;
  // Network interfaces the workers' Gloo binds, comma-separated (dist::InitOptions::iface): passed
  // to them as LOCKSTEP_SOCKET_IFNAME. Empty: the workers' environment decides.
  TORCH_ARG(std::string, iface) = "";
  // NAME=VALUE pairs added to every worker's environment (before the launcher's own variables,
  // which win): e.g. the training settings of an accelerate config, for `lockstep train`.
  TORCH_ARG(EnvVars, worker_env);
  // What the launcher says about the workers (a failure, its stderr tail, restarts): see Note [Reports].
  TORCH_ARG(Reporter, reporter) = stdio_reporter("lockstep run");

 public:
  // Throws c10::ValueError naming the first invalid value and what is allowed.
  void validate() const;
  bool elastic() const { return min_nodes_ > 0; }
  // "N", or "MIN:MAX" for an elastic job.
  void parse_nnodes(const std::string& text);
};

constexpr int kDefaultMasterPort = 29500;  // PyTorch's
// How often a launcher of a multi-node job beats and reads the other nodes' outcomes.
constexpr std::chrono::milliseconds kHeartbeatInterval{250};
constexpr int kWorkersFailed = 1;          // launcher exit code when the group failed for good

// `lockstep run`: starts nproc_per_node copies of the program on this node, one rank each, and
// supervises them until all succeed, one fails (then all are stopped, and maybe restarted), or the
// launcher is told to stop.
//
// Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK (node rank),
// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID (the job's id), LOCKSTEP_RESTART_COUNT,
// LOCKSTEP_SOCKET_IFNAME (with iface) and, unless already set, OMP_NUM_THREADS (cores /
// nproc_per_node, at least 1).
class Launcher {
 public:
  // Validates the options and resolves the program on PATH (c10::ValueError when it is missing).
  explicit Launcher(LaunchOptions options);

  // Returns the launcher's exit code: 0 when every worker of a round exited 0, kWorkersFailed when a
  // round failed with no restarts left, 128 + signal when SIGINT/SIGTERM/SIGHUP stopped it.
  // Throws c10::Error when the rendezvous fails (timeout, node 0 gone).
  int run();

 private:
  // The workers' MASTER_PORT for a round: the given port, else a free one (standalone) or 29500.
  int worker_port() const;
  std::vector<std::string> worker_env(int64_t local_rank, const NodeAssignment& round, int master_port,
                                      int64_t restart) const;
  std::unique_ptr<RendezvousHandler> make_rendezvous() const;

  LaunchOptions options_;
  std::string executable_;  // the program, resolved on PATH
  JobIdentity job_;
};

}  // namespace lockstep::launch
