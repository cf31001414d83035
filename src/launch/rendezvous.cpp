#include "lockstep/launch/rendezvous.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "lockstep/core/report.h"
#include "lockstep/core/tcp_store.h"
#include "lockstep/launch/unique_fd.h"

namespace lockstep::launch {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long node 0 keeps its store up for the other nodes to read a round's outcome.
constexpr milliseconds kStoreLeaveTimeout{10000};
// How often a joining node looks for the others, or for a reason to give up (an abort).
constexpr milliseconds kJoinPoll{20};
// The longest one request to node 0's store may take; see Note [Store requests that never end].
constexpr milliseconds kNodeZeroRequestTimeout{10000};

std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string to_string(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

std::string round_key(int64_t round, const std::string& name) {
  return "lockstep/round" + std::to_string(round) + "/" + name;
}

double as_seconds(milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

constexpr const char* kTwoNodesZero =
    "two launchers were given --node-rank 0 (the other one hosts the rendezvous); give every node its own "
    "--node-rank";

// Note [Two nodes 0]
// Two launchers given --node-rank 0 on one host: the second cannot host the store, whose port the
// first holds, and fails at once; the first would wait for the node it lacks until the rendezvous
// timeout. So the second, when the port answers as a store of this kind of job, tells the first
// through round 0's "abort" key and both fail at once. (On two hosts both reach the store at
// --master-addr, and join() finds node 0 arriving twice.)
bool tell_node_zero(const RendezvousOptions& options, int port) {
  try {
    auto store = connect_tcp_store(options.master_addr(), port, std::chrono::seconds(1), std::chrono::seconds(1));
    store->wait({round_key(0, "job")}, std::chrono::seconds(2));  // the first joins as soon as it hosts
    store->compareSet(round_key(0, "abort"), {}, to_bytes(kTwoNodesZero));
    return true;
  } catch (const std::exception&) {
    return false;  // not ours: the port is someone else's
  }
}

}  // namespace

Rendezvous::Rendezvous(RendezvousOptions options) : options_(std::move(options)) {
  if (options_.nnodes() == 1) return;
  const int port = options_.master_port() + kRendezvousPortOffset;
  try {
    store_ = options_.node_rank() == 0
                 ? host_tcp_store(options_.master_addr(), port, options_.timeout())
                 : connect_tcp_store(options_.master_addr(), port, options_.timeout(),
                                     std::min(kNodeZeroRequestTimeout, options_.timeout()));
  } catch (const std::exception& e) {
    if (options_.node_rank() == 0 && tell_node_zero(options_, port))
      TORCH_CHECK(false, kTwoNodesZero);
    if (options_.node_rank() == 0)
      TORCH_CHECK(false, "node 0 cannot host the launchers' rendezvous on port ", port,
                  " (--master-port + 1; see the README); pick a --master-port whose next port is free (c10d: ",
                  error_text(e), ")");
    TORCH_CHECK(false, "node ", options_.node_rank(), " could not reach node 0's launcher at ", endpoint(), " (0 of ",
                options_.nnodes(), " nodes seen from here, --rdzv-timeout ", as_seconds(options_.timeout()),
                " s): ", error_text(e), "; start node 0 with the same --master-addr/--master-port, or raise ",
                "--rdzv-timeout");
  }
}

Rendezvous::~Rendezvous() = default;

std::string Rendezvous::endpoint() const {
  return options_.master_addr() + ":" + std::to_string(options_.master_port() + kRendezvousPortOffset);
}

NodeAssignment Rendezvous::join(int64_t round, int64_t nproc_per_node) {
  NodeAssignment a;
  a.round = round;
  a.node_rank = options_.node_rank();
  a.nnodes = options_.nnodes();
  if (!store_) {
    a.world_size = nproc_per_node;
    return a;
  }
  const int64_t nnodes = options_.nnodes();
  const std::string me = std::to_string(options_.node_rank());
  std::vector<std::string> node_keys;
  for (int64_t n = 0; n < nnodes; ++n) node_keys.push_back(round_key(round, "node" + std::to_string(n)));

  // See Note [Nodes agree on the job]. "NNODES NODE_RANK\n" and the job of the first node to join.
  const std::string mine = c10::str(nnodes, " ", me, "\n", options_.job().encode());
  store_->add(round_key(round, "connected"), 1);  // before the compareSet: see abort()
  const std::string first = to_string(store_->compareSet(round_key(round, "job"), {}, to_bytes(mine)));
  if (first != mine) agree_on_job(round, first);
  store_->set(round_key(round, "nproc" + me), to_bytes(std::to_string(nproc_per_node)));
  const int64_t arrivals = store_->add(node_keys[options_.node_rank()], 1);
  if (arrivals != 1)
    abort(round, c10::str("node rank ", me, " joined rendezvous round ", round, " ", arrivals,
                          " times: two launchers were given --node-rank ", me, "; give every node its own rank in [0, ",
                          nnodes, ")"));
  const auto deadline = Clock::now() + options_.timeout();
  while (true) {
    bool all_here = false;
    try {
      if (store_->check({round_key(round, "abort")})) {
        const std::string why = to_string(store_->get(round_key(round, "abort")));
        store_->add(round_key(round, "abort_seen"), 1);
        TORCH_CHECK(false, why);
      }
      all_here = store_->check(node_keys);
    } catch (const c10::Error&) {
      throw;
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "lost the rendezvous store at ", endpoint(), " while waiting for round ",
                  round, ": node 0's launcher has gone (", error_text(e), ")");
    }
    if (all_here) break;
    if (Clock::now() >= deadline) {
      std::vector<int64_t> present;
      std::vector<int64_t> missing;
      for (int64_t n = 0; n < nnodes; ++n)
        (store_->check({node_keys[n]}) ? present : missing).push_back(n);
      TORCH_CHECK(false, "rendezvous timed out after ", as_seconds(options_.timeout()), " s: ",
                  present.size(), " of ", nnodes, " nodes arrived at ", endpoint(), " (present: ",
                  c10::Join(", ", present), "; missing: ", c10::Join(", ", missing),
                  "); start `lockstep run --nnodes ", nnodes,
                  " --node-rank R ...` on the missing nodes, or raise --rdzv-timeout");
    }
    std::this_thread::sleep_for(std::min<milliseconds>(kJoinPoll, options_.timeout()));
  }
  // Ranks follow node rank: node n's workers come after those of nodes 0..n-1.
  for (int64_t n = 0; n < nnodes; ++n) {
    const std::string text = to_string(store_->get(round_key(round, "nproc" + std::to_string(n))));
    const int64_t nproc = std::stoll(text);
    if (n < options_.node_rank()) a.first_rank += nproc;
    a.world_size += nproc;
  }
  return a;
}

// Note [Nodes agree on the job]
// Nodes started with different --nnodes would never meet: each waits for its own count of nodes
// (node 0 for 2, node 1 for a node 2 that never comes), until the rendezvous timeout, or node 0
// starts its workers into a group that never forms. Nodes whose commands differ (a quoting slip on
// one host, `--lr 0.02` here and `--lr 0.90` there, another config file) would form one group whose
// ranks train differently, and a second job pointed at the same endpoint would merge into the
// first. So the first node to join records its --nnodes and its JobIdentity: the whole command,
// the variables its config gave the workers, and the job's id (--rdzv-id, else derived from the
// command). A node that disagrees writes the first difference to the round's "abort" key and
// fails, and every node waiting in join() reads the key and fails with the same words at once
// (node 0 hosts the store, so when it is the one to fail it first waits, briefly, until the others
// have read the reason). A node whose job has another id that was given on purpose is of another
// job: it is refused alone, and the job it stumbled into goes on. The elastic rendezvous compares
// the same record with the launcher it reaches and refuses the newcomer, never the running job.
void Rendezvous::agree_on_job(int64_t round, const std::string& first) {
  const std::string me = "node " + std::to_string(options_.node_rank());
  const size_t newline = first.find('\n');
  std::istringstream fields(first.substr(0, newline));
  int64_t other_nnodes = -1, other_node = -1;
  fields >> other_nnodes >> other_node;
  const std::string them = "node " + std::to_string(other_node);
  if (other_nnodes != options_.nnodes())
    abort(round, c10::str("nodes disagree on the job: ", me, " was started with --nnodes ", options_.nnodes(), " but ",
                          them, " with --nnodes ", other_nnodes,
                          "; start every node with the same --nnodes (and each with its own --node-rank)"));
  JobIdentity theirs;
  try {
    theirs = JobIdentity::decode(newline == std::string::npos ? "" : first.substr(newline + 1));
  } catch (const c10::Error&) {
    TORCH_CHECK(false, "the rendezvous at ", endpoint(), " holds no job this launcher can read: another program, or ",
                "another version of lockstep, uses the port; pick another --master-port");
  }
  const JobIdentity& job = options_.job();
  TORCH_CHECK(!job.other_job(theirs), "the rendezvous at ", endpoint(), " belongs to another job: its --rdzv-id is '",
              theirs.id(), "', this node's '", job.id(), "'; give two jobs different --master-port (or "
              "--master-addr), or give every node of one job the same --rdzv-id");
  const std::string difference = job.difference(theirs, me, them);
  if (!difference.empty())
    abort(round, "nodes disagree on the job: " + difference +
                     " (if these are two jobs, give each its own --master-port, or each its own --rdzv-id)");
}
void Rendezvous::abort(int64_t round, const std::string& why) {
  store_->compareSet(round_key(round, "abort"), {}, to_bytes(why));
  if (options_.node_rank() == 0) {
    const auto deadline = Clock::now() + kStoreLeaveTimeout;
    try {
      while (Clock::now() < deadline &&
             store_->add(round_key(round, "abort_seen"), 0) < store_->add(round_key(round, "connected"), 0) - 1)
        std::this_thread::sleep_for(kJoinPoll);
    } catch (const std::exception&) {
      // Nothing more to tell anyone.
    }
  }
  throw c10::Error(why);  // no backtrace: the reason is the whole message
}

std::string Rendezvous::report_failure(int64_t round, const std::string& what) {
  if (!store_) return what;
  try {
    // compareSet answers with the value now stored: ours if nobody was first.
    return to_string(store_->compareSet(round_key(round, "failed"), {}, to_bytes(what)));
  } catch (const std::exception&) {
    // Node 0 is gone; the other nodes learn of it from their own store errors.
    return what;
  }
}

std::optional<std::string> Rendezvous::failure(int64_t round) {
  if (!store_) return std::nullopt;
  try {
    if (!store_->check({round_key(round, "failed")})) return std::nullopt;
    return to_string(store_->get(round_key(round, "failed")));
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "node ", options_.node_rank(), " lost the rendezvous store at ", endpoint(),
                ": node 0's launcher has exited or the network failed (", error_text(e), ")");
  }
}

// Note [Launcher heartbeats]
// A node whose launcher is SIGKILLed (or hangs, or is cut off) takes its workers with it
// (PR_SET_PDEATHSIG), and the other nodes' workers then wait in a collective until its timeout.
// So while a round runs, every launcher bumps its counter in the store several times a second, and
// watches the others' counters: one that has not moved for --heartbeat-timeout, by this node's
// clock, is declared failed and the round ends on every node (and restarts if restarts remain).
// Counting on the local steady clock needs no agreement between the nodes' clocks. Node 0's death
// needs no heartbeat: it hosts the store, and every other node's next store call fails.
void Rendezvous::beat(int64_t round) {
  if (!store_) return;
  try {
    store_->add(round_key(round, "beat" + std::to_string(options_.node_rank())), 1);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "node ", options_.node_rank(), " lost the rendezvous store at ", endpoint(),
                ": node 0's launcher has exited or the network failed (", error_text(e), ")");
  }
}

std::optional<int64_t> Rendezvous::silent_node(int64_t round, milliseconds timeout) {
  if (!store_) return std::nullopt;
  const auto now = Clock::now();
  if (beats_round_ != round) {
    beats_round_ = round;
    last_beat_.assign(static_cast<size_t>(options_.nnodes()), -1);
    last_change_.assign(static_cast<size_t>(options_.nnodes()), now);
  }
  for (int64_t n = 0; n < options_.nnodes(); ++n) {
    if (n == options_.node_rank()) continue;
    int64_t beats = 0;
    try {
      beats = store_->add(round_key(round, "beat" + std::to_string(n)), 0);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "node ", options_.node_rank(), " lost the rendezvous store at ", endpoint(),
                  ": node 0's launcher has exited or the network failed (", error_text(e), ")");
    }
    const auto i = static_cast<size_t>(n);
    if (beats != last_beat_[i]) {
      last_beat_[i] = beats;
      last_change_[i] = now;
    } else if (now - last_change_[i] >= timeout) {
      silent_.insert(n);  // leave() waits for it no more
      return n;
    }
  }
  return std::nullopt;
}

void Rendezvous::report_done(int64_t round) {
  if (store_) store_->add(round_key(round, "done"), 1);
}

bool Rendezvous::all_done(int64_t round) {
  if (!store_) return true;
  try {
    return store_->add(round_key(round, "done"), 0) == options_.nnodes();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "node ", options_.node_rank(), " lost the rendezvous store at ", endpoint(),
                ": node 0's launcher has exited or the network failed (", error_text(e), ")");
  }
}

void Rendezvous::leave(int64_t round) {
  if (!store_) return;
  try {
    if (options_.node_rank() != 0) {
      store_->add(round_key(round, "left" + std::to_string(options_.node_rank())), 1);
      return;
    }
    std::vector<std::string> others;
    for (int64_t n = 1; n < options_.nnodes(); ++n)
      if (!silent_.count(n)) others.push_back(round_key(round, "left" + std::to_string(n)));
    if (others.empty()) return;
    store_->wait(others, kStoreLeaveTimeout);
  } catch (const std::exception&) {
    // The outcome is settled; a node that does not say goodbye in time does not change it.
  }
}

namespace {

// Whether a TCP socket can bind `port` on every address now (0: the kernel picks); the port bound.
int bind_port(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  TORCH_CHECK(fd.valid(), "socket: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return -1;
  socklen_t len = sizeof(addr);
  TORCH_CHECK(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0,
              "getsockname: ", std::strerror(errno));
  return ntohs(addr.sin_port);
}

}  // namespace

// Note [Ports outside the ephemeral range]
// The port is drawn from below the kernel's ephemeral range (ip_local_port_range), not taken from
// a bind to port 0, which answers with a port inside it. Workers other than rank 0 dial the port,
// retrying, before rank 0 listens on it; on loopback a retried connect to a port of the ephemeral
// range can be given that same port as its source and connect to itself (TCP simultaneous open),
// and rank 0 then fails with "address already in use". Outside the range no connect takes it.
int free_tcp_port() {
  int ephemeral_low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
  constexpr int kLow = 10000;
  if (ephemeral_low > kLow + 1000) {
    std::random_device random;
    for (int attempt = 0; attempt < 200; ++attempt) {
      const int port = kLow + static_cast<int>(random() % static_cast<unsigned>(ephemeral_low - kLow));
      if (bind_port(port) == port) return port;
    }
  }
  const int port = bind_port(0);
  TORCH_CHECK(port > 0, "cannot bind a TCP port: ", std::strerror(errno));
  return port;
}

}  // namespace lockstep::launch
