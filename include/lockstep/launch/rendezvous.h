#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lockstep/launch/job_identity.h"

namespace c10d {
class TCPStore;
}  // namespace c10d

namespace lockstep::launch {

// Note [Launcher rendezvous port]
// The workers' own process group (c10d env:// init) binds MASTER_PORT on the master node. The
// launchers therefore meet one port higher, on MASTER_PORT + 1, in a c10d TCPStore hosted by node
// 0's launcher; the two stores never compete for a port, and a firewall needs both ports open.
constexpr int kRendezvousPortOffset = 1;

struct RendezvousOptions {
  TORCH_ARG(int64_t, nnodes) = 1;
  TORCH_ARG(int64_t, node_rank) = 0;
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  // The workers' MASTER_PORT; the launchers use master_port + kRendezvousPortOffset.
  TORCH_ARG(int, master_port) = 29500;
  // The job this node belongs to: every node must run the same command. See Note [Nodes agree on the job].
  TORCH_ARG(JobIdentity, job);
  // How long join() waits for every node, and how long a node waits to reach node 0.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(300);
};

// This node's share of one round's world.
struct NodeAssignment {
  int64_t round = 0;
  int64_t world_size = 0;  // workers over all nodes
  int64_t first_rank = 0;  // global rank of this node's local rank 0
  int64_t node_rank = 0;   // this node's place in the round
  int64_t nnodes = 1;      // nodes in the round
  std::string master_addr;  // where the workers' rank 0 runs; empty: the launcher's --master-addr
};

// What a launcher needs from the agreement between nodes, round after round: the fixed membership
// of Rendezvous below, or ElasticRendezvous (elastic_rendezvous.h), whose membership changes.
// `round` is the value of NodeAssignment::round that join() returned; join() takes the lowest round
// the caller will accept (the previous one + 1).
class RendezvousHandler {
 public:
  virtual ~RendezvousHandler() = default;
  virtual NodeAssignment join(int64_t round, int64_t nproc_per_node) = 0;
  virtual std::string report_failure(int64_t round, const std::string& what) = 0;
  virtual std::optional<std::string> failure(int64_t round) = 0;
  virtual void beat(int64_t round) = 0;
  virtual std::optional<int64_t> silent_node(int64_t round, std::chrono::milliseconds timeout) = 0;
  // Nodes that wait to join while `round` runs: a reason to end it and form a larger one.
  virtual int64_t waiting_nodes(int64_t /*round*/) { return 0; }
  virtual void report_done(int64_t round) = 0;
  virtual bool all_done(int64_t round) = 0;
  virtual void leave(int64_t round) = 0;
  // Whether any other node may take part (false: nothing to agree on).
  virtual bool multi_node() const = 0;
};

// Agreement between the launchers of all nodes, one round per (re)start of the worker group: who
// is there, how many workers each node brings, whether any node's workers failed, and when all
// nodes are done. With one node there is nobody to agree with and no store is made.
//
// Keys are namespaced by round, so a restarted round starts from a clean slate. Store errors after
// the join (node 0's launcher gone, network down) throw c10::Error saying so.
class Rendezvous : public RendezvousHandler {
 public:
  // Node 0 starts the store (throws naming the port if it is taken); other nodes connect to it,
  // waiting up to the timeout.
  explicit Rendezvous(RendezvousOptions options);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // Blocks until every node has joined `round`, then assigns global ranks in node-rank order.
  // On timeout throws c10::Error saying how many of how many nodes arrived, and which; when nodes
  // disagree on --nnodes or on the command, every node throws at once naming the first difference;
  // a node of another job (another --rdzv-id) is refused alone.
  NodeAssignment join(int64_t round, int64_t nproc_per_node) override;

  // Tells every node that `round` failed; the first report of a round is kept. Returns that first
  // report: `what`, or an earlier failure on another node (also `what` when the store is gone).
  std::string report_failure(int64_t round, const std::string& what) override;
  // The failure some node reported for `round`, if any.
  std::optional<std::string> failure(int64_t round) override;

  // Tells the other nodes that this node's launcher is alive. See Note [Launcher heartbeats].
  void beat(int64_t round) override;
  // A node whose heartbeat has not moved for `timeout`, as seen from here; nullopt if none.
  std::optional<int64_t> silent_node(int64_t round, std::chrono::milliseconds timeout) override;

  void report_done(int64_t round) override;
  bool all_done(int64_t round) override;
  // Called once the outcome is known. Node 0 waits (briefly) for the others to leave, so that its
  // store outlives their last read.
  void leave(int64_t round) override;

  bool multi_node() const override { return options_.nnodes() > 1; }
  int64_t nnodes() const { return options_.nnodes(); }
  int64_t node_rank() const { return options_.node_rank(); }

 private:
  std::string endpoint() const;  // "HOST:PORT" of the launchers' store
  // Fails `round` for every node with `why`, and throws it. See Note [Nodes agree on the job].
  [[noreturn]] void abort(int64_t round, const std::string& why);
  // Compares this node with `first`, the record of the first node to join; aborts `round` (or
  // refuses this node alone) when they are not one job. See Note [Nodes agree on the job].
  void agree_on_job(int64_t round, const std::string& first);

  RendezvousOptions options_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  // Per node: the last heartbeat count seen and when it last changed, for round beats_round_.
  int64_t beats_round_ = -1;
  std::vector<int64_t> last_beat_;
  std::vector<std::chrono::steady_clock::time_point> last_change_;
  std::set<int64_t> silent_;  // nodes declared failed by their silence
};

// A TCP port that was free on this host a moment ago, below the kernel's ephemeral range where
// one exists (Note [Ports outside the ephemeral range]).
int free_tcp_port();

}  // namespace lockstep::launch
