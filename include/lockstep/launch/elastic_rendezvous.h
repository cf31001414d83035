#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lockstep/launch/rendezvous.h"

namespace lockstep::launch {

// Note [Elastic rendezvous without a single point of failure]
// `lockstep run --nnodes MIN:MAX` lets nodes leave and arrive. Each (re)start of the workers is a
// round: the launchers alive at that moment meet, the round closes once MAX have arrived, or once
// at least MIN have and no other arrived for the last-call period, and the members get node ranks
// in the order they arrived. A node that arrives while a round runs says it is waiting; the
// members then end the round (their workers stop; the training loop resumes from its newest
// checkpoint) and a larger round forms. A node that leaves (its launcher killed, silent for
// --heartbeat-timeout, or its workers failing) ends the round too; the others meet again without it.
//
// torchrun's c10d backend keeps the rounds in a store that one launcher hosts: when that node dies,
// every survivor loses the store and the job ends. Here every launcher hosts a store of its own
// from the start, and the rounds live in the store of one of them, the leader: the first member
// of the last round (in node-rank order) that is still alive. When the leader's store stops
// answering, every survivor takes the next member of that list that answers as the leader; as all
// the stores already run, "does not answer" means "is gone". A launcher that adopts a leader writes
// its name into its own store under "leader", so a newcomer, given any reachable launcher of the
// job (--rdzv-endpoint: a list, like SLURM's node list), is pointed at the leader. At the very first
// round nobody has led yet: the first endpoint of the list that answers leads, after a short wait
// in which it looks again for a leader named elsewhere (launchers started within that wait of each
// other agree). A network partition can give each side its own leader; that is not handled. A
// launcher that was stopped (SIGSTOP, a debugger, a VM paused) past the heartbeat timeout is gone
// for the others, who have formed a round without it: each join() looks for the leader anew, so a
// woken leader finds that the members it led now follow another and joins that one as a newcomer;
// it never leads a second world beside theirs.
//
// Rounds are numbered across leaders (a new leader continues after the last round it saw), so the
// keys of a round never meet those of an earlier one.

struct ElasticRendezvousOptions {
  TORCH_ARG(int64_t, min_nodes) = 1;
  TORCH_ARG(int64_t, max_nodes) = 1;
  // HOST:PORT of launchers of the job, in the order in which they lead at the very start.
  TORCH_ARG(std::vector<std::string>, endpoints);
  // This node's address as the other nodes reach it; empty: the source address of the route to
  // the first endpoint. The workers' MASTER_ADDR is the leader's.
  TORCH_ARG(std::string, address) = "";
  // The port of this node's own store; 0: the first endpoint's port.
  TORCH_ARG(int, port) = 0;
  // The job this node belongs to: a node whose job differs from the launcher's it reaches is
  // refused. See Note [Nodes agree on the job].
  TORCH_ARG(JobIdentity, job);
  // How long join() waits for MIN nodes, or for a leader to answer.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(300);
  // How long a round stays open for more nodes once MIN have arrived.
  TORCH_ARG(std::chrono::milliseconds, last_call) = std::chrono::seconds(2);
};

// See Note [Elastic rendezvous without a single point of failure].
class ElasticRendezvous : public RendezvousHandler {
 public:
  // Starts this node's own store (throws naming the port when it is taken).
  explicit ElasticRendezvous(ElasticRendezvousOptions options);
  ~ElasticRendezvous() override;
  ElasticRendezvous(const ElasticRendezvous&) = delete;
  ElasticRendezvous& operator=(const ElasticRendezvous&) = delete;

  // Joins the first round numbered `round` or later that is still open. Throws c10::Error after the
  // timeout saying how many of MIN nodes arrived, or that no launcher of the job answered.
  NodeAssignment join(int64_t round, int64_t nproc_per_node) override;
  std::string report_failure(int64_t round, const std::string& what) override;
  // Also the leader's loss: "the rendezvous leader ... stopped answering".
  std::optional<std::string> failure(int64_t round) override;
  void beat(int64_t round) override;
  std::optional<int64_t> silent_node(int64_t round, std::chrono::milliseconds timeout) override;
  int64_t waiting_nodes(int64_t round) override;
  void report_done(int64_t round) override;
  bool all_done(int64_t round) override;
  void leave(int64_t round) override;
  bool multi_node() const override { return true; }

  const std::string& id() const { return me_; }  // "ADDRESS:PORT"
  const std::string& leader() const { return leader_; }
  // The members of the last round joined, in node-rank order.
  const std::vector<std::string>& members() const { return members_; }

 private:
  using Store = c10::intrusive_ptr<c10d::TCPStore>;
  struct LeaderLost {};

  // Runs `f` on the leader's store; a store error marks the leader gone and throws LeaderLost.
  template <class F>
  auto on_leader(F f);
  // The store of the launcher at `endpoint` when it answers and is of this job (null when it does
  // not answer); throws c10::Error when it belongs to another job.
  Store reach(const std::string& endpoint);
  void find_leader(std::chrono::steady_clock::time_point deadline);
  bool adopt(const std::string& leader);
  NodeAssignment lead(int64_t round, int64_t nproc_per_node, std::chrono::steady_clock::time_point deadline);
  std::optional<NodeAssignment> follow(int64_t round, int64_t nproc_per_node,
                                       std::chrono::steady_clock::time_point deadline);
  NodeAssignment assignment(int64_t round, int64_t slot, int64_t nnodes);
  std::string lost_leader_message() const;

  ElasticRendezvousOptions options_;
  std::string me_;
  Store own_;     // this node's store, always up
  Store leader_store_;  // the leader's (own_ when this node leads); null when unknown
  std::string leader_;
  std::string lost_;  // the leader that stopped answering, and why, until a failure() reports it
  std::set<std::string> gone_;  // launchers known to have stopped answering
  std::set<std::string> unanswered_;  // accepted a connection but never answered, in this join()
  std::vector<std::string> members_;
  int64_t round_ = -1;  // the last round joined
  int64_t slot_ = -1;   // this node's rank in it
  // Heartbeats of round_'s members: the last count seen and when it last changed.
  std::vector<int64_t> last_beat_;
  std::vector<std::chrono::steady_clock::time_point> last_change_;
  std::set<int64_t> silent_;
};

}  // namespace lockstep::launch
