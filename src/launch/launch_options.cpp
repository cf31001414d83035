// LaunchOptions' checks: every count and duration `lockstep run` is given, before anything starts.
#include <c10/util/Exception.h>

#include <cmath>
#include <string>

#include "lockstep/core/network.h"
#include "lockstep/core/process.h"
#include "lockstep/launch/launcher.h"

namespace lockstep::launch {

// Note [Launcher bounds]
// Every count and duration is checked against a range before anything starts: c10d counts
// timeouts in whole milliseconds and reads 0 as "wait forever", seconds are turned into int64
// milliseconds (1e300 would overflow), and every worker's environment is built up front (so a
// huge --nproc-per-node would exhaust memory before the first fork).
namespace {

constexpr int64_t kMaxNprocPerNode = 1024;
constexpr int64_t kMaxNnodes = 65536;
constexpr int64_t kMaxRestarts = 1000000;
constexpr double kMinRdzvTimeout = 0.001;      // seconds: 1 ms, c10d's resolution
constexpr double kMaxDuration = 7 * 24 * 3600;  // seconds: a week, far beyond any sane wait
constexpr double kMinHeartbeatTimeout = 1.0;    // seconds: four beats

void check_count(const char* flag, int64_t value, int64_t low, int64_t high, const std::string& hint) {
  TORCH_CHECK_VALUE(value >= low && value <= high, flag, " ", value, " is out of range: it must be in [",
                    low, ", ", high, "]; ", hint);
}

void check_seconds(const char* flag, double value, double low, const std::string& hint) {
  TORCH_CHECK_VALUE(std::isfinite(value) && value >= low && value <= kMaxDuration, flag, " ", value,
                    " is out of range: it must be a number of seconds in [", low, ", ", kMaxDuration,
                    "] (up to 7 days); ", hint);
}

}  // namespace

void LaunchOptions::validate() const {
  TORCH_CHECK_VALUE(!program_.empty() && !program_[0].empty(),
                    "no program to run; usage: lockstep run [OPTIONS] -- PROGRAM [ARGS...]");
  // See Note [Launcher bounds].
  if (nproc_per_node_ < 1)
    TORCH_CHECK_VALUE(false, "--nproc-per-node must be at least 1, got ", nproc_per_node_);
  check_count("--nproc-per-node", nproc_per_node_, 1, kMaxNprocPerNode,
              "start one worker per device or core (this host has " + std::to_string(available_cores()) +
                  " cores)");
  if (nnodes_ < 1) TORCH_CHECK_VALUE(false, "--nnodes must be at least 1, got ", nnodes_);
  check_count("--nnodes", nnodes_, 1, kMaxNnodes, "give the number of hosts taking part");
  if (elastic()) {
    TORCH_CHECK_VALUE(min_nodes_ <= nnodes_, "--nnodes ", min_nodes_, ":", nnodes_,
                      " has MIN above MAX; give MIN:MAX with 1 <= MIN <= MAX");
    TORCH_CHECK_VALUE(node_rank_ == 0, "--node-rank ", node_rank_, " was given to an elastic job (--nnodes ",
                      min_nodes_, ":", nnodes_, "), whose rendezvous numbers the nodes in the order they "
                      "arrive; drop --node-rank");
    TORCH_CHECK_VALUE(!standalone_, "--standalone runs a single node, but --nnodes is ", min_nodes_, ":", nnodes_);
    check_seconds("--rdzv-last-call", rdzv_last_call_, 0.0, "the default is 2");
  }
  TORCH_CHECK_VALUE(node_rank_ >= 0 && node_rank_ < nnodes_, "--node-rank ", node_rank_,
                    " is outside [0, ", nnodes_, ") for --nnodes ", nnodes_,
                    "; number the nodes 0 to ", nnodes_ - 1);
  TORCH_CHECK_VALUE(!standalone_ || nnodes_ == 1, "--standalone runs a single node, but --nnodes is ",
                    nnodes_, "; drop --standalone and give --master-addr and --master-port");
  TORCH_CHECK_VALUE(!standalone_ || master_port_ == 0, "--standalone picks a free port itself, but --master-port ",
                    master_port_, " was given; use one or the other");
  TORCH_CHECK_VALUE(master_port_ >= 0 && master_port_ + kRendezvousPortOffset <= 65535, "--master-port ",
                    master_port_, " is not usable: the workers use it and the launchers the next port, "
                    "so it must be in [1, 65534] (or 0 for the default)");
  TORCH_CHECK_VALUE(!master_addr_.empty(), "--master-addr is empty; give node 0's host name or address");
  check_seconds("--rdzv-timeout", rdzv_timeout_, kMinRdzvTimeout,
                "c10d counts whole milliseconds and takes 0 as 'wait forever'; the default is 300");
  check_count("--max-restarts", max_restarts_, 0, kMaxRestarts, "0 (the default) never restarts");
  check_seconds("--grace-period", grace_period_, 0.0,
                "it is how long stopping workers may take before SIGKILL; the default is 5");
  if (!iface_.empty()) parse_interfaces(iface_, "--iface");
  check_seconds("--heartbeat-timeout", heartbeat_timeout_, kMinHeartbeatTimeout,
                "launchers beat every " + std::to_string(kHeartbeatInterval.count()) +
                    " ms, so allow several beats; the default is 30");
}

}  // namespace lockstep::launch
