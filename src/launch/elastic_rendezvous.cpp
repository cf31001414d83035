#include "lockstep/launch/elastic_rendezvous.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <sstream>
#include <thread>

#include "lockstep/core/report.h"
#include "lockstep/core/tcp_store.h"
#include "lockstep/launch/endpoints.h"

namespace lockstep::launch {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kPoll{20};            // how often a waiting node looks again
constexpr milliseconds kProbe{300};          // how long a launcher may take to accept a connection
constexpr milliseconds kSettle{500};         // see Note [Elastic rendezvous without a single point of failure]
constexpr milliseconds kRequestTimeout{10000};  // one store request; beyond it the leader is gone
// c10d's connect to an endpoint that accepts TCP (kProbe said so). Not kProbe: c10d looks up the
// names of the addresses it connects to (getnameinfo), and with a slow resolver that took 5 s in the
// connecting thread, before the connection was made; at 1 s every other 3-node round in the suite
// lost its leader. An endpoint that accepts but never answers is still cut after the handshake
// timeout (Note [Store requests that never end]).
constexpr milliseconds kStoreConnect{10000};
constexpr milliseconds kLeaveTimeout{10000};

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }
std::string key(int64_t round, const std::string& name) { return "elastic/" + std::to_string(round) + "/" + name; }
double seconds(milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

// The leader `store`'s owner follows ("" when it follows none yet, or does not answer).
std::string named_leader(c10d::TCPStore& store) {
  try {
    return store.check({"leader"}) ? text(store.get("leader")) : std::string();
  } catch (const std::exception&) {
    return "";
  }
}

// What a member writes about itself when it joins a round: "ID NPROC".
struct Arrival {
  std::string id;
  int64_t nproc = 0;
};

Arrival parse_arrival(const std::string& line) {
  Arrival a;
  std::istringstream(line) >> a.id >> a.nproc;
  return a;
}

}  // namespace

ElasticRendezvous::ElasticRendezvous(ElasticRendezvousOptions options) : options_(std::move(options)) {
  TORCH_CHECK_VALUE(options_.min_nodes() >= 1 && options_.min_nodes() <= options_.max_nodes(), "--nnodes ",
                    options_.min_nodes(), ":", options_.max_nodes(), " is not a range MIN:MAX with 1 <= MIN <= MAX");
  TORCH_CHECK_VALUE(!options_.endpoints().empty(), "an elastic job needs at least one rendezvous endpoint (HOST:PORT)");
  for (const std::string& e : options_.endpoints()) split_endpoint(e);  // throws naming a malformed one
  const auto [first_host, first_port] = split_endpoint(options_.endpoints().front());
  const int port = options_.port() != 0 ? options_.port() : first_port;
  const std::string address = options_.address().empty() ? route_source_address(first_host, first_port) : options_.address();
  me_ = address + ":" + std::to_string(port);
  try {
    own_ = host_tcp_store(address, port, kRequestTimeout);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "this node (", me_, ") cannot start its rendezvous store on port ", port,
                ": another program (or another launcher on this host) holds it; each node of an elastic job "
                "needs its own address or port (", error_text(e), ")");
  }
  own_->set("job", bytes(options_.job().encode()));  // See Note [Nodes agree on the job].
}

ElasticRendezvous::Store ElasticRendezvous::reach(const std::string& endpoint) {
  const auto [host, port] = split_endpoint(endpoint);
  if (unanswered_.count(endpoint) || !accepts_connections(host, port, kProbe)) return {};
  Store store;
  std::string record;
  try {
    store = connect_tcp_store(host, port, kStoreConnect, std::min(kRequestTimeout, options_.timeout()));
    if (!store->check({"job"})) return {};  // a launcher that has just started
    record = text(store->get("job"));
  } catch (const std::exception&) {
    unanswered_.insert(endpoint);  // see Note [Store requests that never end]
    return {};
  }
  JobIdentity theirs;
  try {
    theirs = JobIdentity::decode(record);
  } catch (const c10::Error&) {
    TORCH_CHECK(false, "node ", me_, ": ", endpoint, " answers as a c10d store but holds no job this launcher can "
                "read (another program, or another version of lockstep); give --rdzv-endpoint launchers of this job");
  }
  const JobIdentity& job = options_.job();
  TORCH_CHECK(!job.other_job(theirs), "node ", me_, " reached ", endpoint, ", a launcher of another job (its --rdzv-id is '",
              theirs.id(), "', this node's '", job.id(), "'); give --rdzv-endpoint launchers of this job, or the same ",
              "--rdzv-id to every node of one job");
  const std::string difference = job.difference(theirs, "node " + me_, "the launcher at " + endpoint);
  TORCH_CHECK(difference.empty(), "node ", me_, " is not of the job of the launcher it reached: ", difference,
              " (if these are two jobs, give each its own --rdzv-endpoint)");
  return store;
}

ElasticRendezvous::~ElasticRendezvous() = default;

template <class F>
auto ElasticRendezvous::on_leader(F f) {
  if (!leader_store_) throw LeaderLost{};
  try {
    return f(*leader_store_);
  } catch (const std::exception& e) {
    if (leader_ != me_) {
      lost_ = "the rendezvous leader " + leader_ + " stopped answering (" + error_text(e) + ")";
      gone_.insert(leader_);
      leader_store_.reset();
    }
    throw LeaderLost{};
  }
}

std::string ElasticRendezvous::lost_leader_message() const {
  return lost_.empty() ? "the rendezvous leader " + leader_ + " stopped answering" : lost_;
}

// Adopts `leader` when it answers and calls itself the leader; false otherwise.
bool ElasticRendezvous::adopt(const std::string& leader) {
  Store store = leader == me_ ? own_ : reach(leader);
  if (!store || (leader != me_ && named_leader(*store) != leader)) return false;
  leader_ = leader;
  leader_store_ = store;
  own_->set("leader", bytes(leader));
  return true;
}

// See Note [Elastic rendezvous without a single point of failure].
void ElasticRendezvous::find_leader(Clock::time_point deadline) {
  bool settled = false;
  while (true) {
    std::vector<std::string> order = members_;
    for (const std::string& e : options_.endpoints())
      if (std::find(order.begin(), order.end(), e) == order.end()) order.push_back(e);
    std::string first_alive, named;
    for (const std::string& c : order) {
      if (gone_.count(c)) continue;
      if (c == me_) {
        if (first_alive.empty()) first_alive = me_;
        continue;
      }
      Store store = reach(c);
      if (!store) continue;
      if (first_alive.empty()) first_alive = c;
      const std::string l = named_leader(*store);
      if (!l.empty() && !gone_.count(l)) {
        named = l;
        break;
      }
    }
    if (!named.empty() && adopt(named)) return;
    if (named.empty() && first_alive == me_) {
      // At the first round, wait once for a leader another endpoint may be naming right now.
      if (settled || !members_.empty()) {
        adopt(me_);
        return;
      }
      settled = true;
      std::this_thread::sleep_for(kSettle);
      continue;
    }
    TORCH_CHECK(Clock::now() < deadline, "elastic rendezvous timed out after ", seconds(options_.timeout()),
                " s: node ", me_, " found no leader; ",
                first_alive.empty() ? "no launcher answered at " + c10::Join(", ", options_.endpoints())
                                    : first_alive + " answers but leads no round",
                "; start the job's first node, give this node an endpoint of a running launcher "
                "(--rdzv-endpoint), or raise --rdzv-timeout");
    std::this_thread::sleep_for(kPoll);
  }
}

NodeAssignment ElasticRendezvous::join(int64_t round, int64_t nproc_per_node) {
  const auto deadline = Clock::now() + options_.timeout();
  round = std::max(round, round_ + 1);
  // The leader is looked for anew: this node may have led members that follow another by now.
  leader_store_.reset();
  unanswered_.clear();
  while (true) {
    if (!leader_store_) find_leader(deadline);
    try {
      if (leader_ == me_) return lead(round, nproc_per_node, deadline);
      if (std::optional<NodeAssignment> a = follow(round, nproc_per_node, deadline)) return *a;
    } catch (const LeaderLost&) {
      // Look for the next leader.
    }
  }
}

NodeAssignment ElasticRendezvous::lead(int64_t round, int64_t nproc_per_node, Clock::time_point deadline) {
  c10d::TCPStore& s = *own_;
  if (s.check({"current"})) round = std::max<int64_t>(round, std::stoll(text(s.get("current"))) + 1);
  s.add(key(round, "arrivals"), 1);  // slot 0: nobody else joins before "current" names the round
  s.set(key(round, "node0"), bytes(c10::str(me_, " ", nproc_per_node)));
  s.set("current", bytes(std::to_string(round)));
  int64_t seen = 1;
  auto changed = Clock::now();
  while (true) {
    const int64_t n = s.add(key(round, "arrivals"), 0);
    if (n != seen) {
      seen = n;
      changed = Clock::now();
    }
    if (n >= options_.max_nodes() || (n >= options_.min_nodes() && Clock::now() - changed >= options_.last_call()))
      break;
    if (Clock::now() >= deadline) {
      s.set(key(round, "closed"), bytes("0"));  // the waiting nodes give up with us
      TORCH_CHECK(false, "elastic rendezvous timed out after ", seconds(options_.timeout()), " s: ", n, " of at least ",
                  options_.min_nodes(), " nodes arrived at the leader ", me_,
                  "; start more nodes with the same --rdzv-endpoint, lower MIN in --nnodes MIN:MAX, or raise "
                  "--rdzv-timeout");
    }
    std::this_thread::sleep_for(kPoll);
  }
  const int64_t nnodes = std::min(seen, options_.max_nodes());
  s.set(key(round, "closed"), bytes(std::to_string(nnodes)));
  return assignment(round, 0, nnodes);
}

std::optional<NodeAssignment> ElasticRendezvous::follow(int64_t round, int64_t nproc_per_node,
                                                        Clock::time_point deadline) {
  int64_t waiting_in = -1;  // the running round this node said it waits on
  auto expired = [&](const std::string& what) {
    TORCH_CHECK(Clock::now() < deadline, "elastic rendezvous timed out after ", seconds(options_.timeout()),
                " s: node ", me_, " ", what, " at the leader ", leader_,
                "; raise --rdzv-timeout, or stop a node (the job has at most ", options_.max_nodes(), ")");
  };
  while (true) {
    const int64_t current = on_leader([&](c10d::TCPStore& s) -> int64_t {
      return s.check({"current"}) ? std::stoll(text(s.get("current"))) : -1;
    });
    if (current < round || current == waiting_in) {
      expired(current == waiting_in ? "waited for round " + std::to_string(current) + " to end" : "waited for a round");
      std::this_thread::sleep_for(kPoll);
      continue;
    }
    const bool running = on_leader([&](c10d::TCPStore& s) { return s.check({key(current, "closed")}); });
    if (running) {
      on_leader([&](c10d::TCPStore& s) { return s.add(key(current, "waiting"), 1); });
      waiting_in = current;
      continue;
    }
    const int64_t slot = on_leader([&](c10d::TCPStore& s) { return s.add(key(current, "arrivals"), 1); }) - 1;
    on_leader([&](c10d::TCPStore& s) {
      s.set(key(current, "node" + std::to_string(slot)),
            bytes(c10::str(me_, " ", nproc_per_node)));
      return 0;
    });
    while (!on_leader([&](c10d::TCPStore& s) { return s.check({key(current, "closed")}); })) {
      expired("waited for round " + std::to_string(current) + " to close");
      std::this_thread::sleep_for(kPoll);
    }
    const int64_t nnodes = std::stoll(on_leader([&](c10d::TCPStore& s) { return text(s.get(key(current, "closed"))); }));
    TORCH_CHECK(nnodes > 0, "elastic rendezvous: the leader ", leader_, " gave up on round ", current,
                ": fewer than ", options_.min_nodes(), " nodes arrived before its --rdzv-timeout");
    if (slot < nnodes) return on_leader([&](c10d::TCPStore&) { return assignment(current, slot, nnodes); });
    on_leader([&](c10d::TCPStore& s) { return s.add(key(current, "waiting"), 1); });  // too late for it
    waiting_in = current;
  }
}

NodeAssignment ElasticRendezvous::assignment(int64_t round, int64_t slot, int64_t nnodes) {
  NodeAssignment a;
  a.round = round;
  a.node_rank = slot;
  a.nnodes = nnodes;
  std::vector<std::string> members;
  for (int64_t n = 0; n < nnodes; ++n) {
    const Arrival node = parse_arrival(text(leader_store_->get(key(round, "node" + std::to_string(n)))));
    if (n == slot) a.first_rank = a.world_size;
    a.world_size += node.nproc;
    members.push_back(node.id);
    gone_.erase(node.id);
  }
  a.master_addr = split_endpoint(members.front()).first;
  members_ = std::move(members);
  round_ = round;
  slot_ = slot;
  last_beat_.assign(members_.size(), -1);
  last_change_.assign(members_.size(), Clock::now());
  silent_.clear();
  lost_.clear();
  return a;
}

std::string ElasticRendezvous::report_failure(int64_t round, const std::string& what) {
  try {
    return on_leader([&](c10d::TCPStore& s) { return text(s.compareSet(key(round, "failed"), {}, bytes(what))); });
  } catch (const LeaderLost&) {
    return what;
  }
}

std::optional<std::string> ElasticRendezvous::failure(int64_t round) {
  try {
    return on_leader([&](c10d::TCPStore& s) -> std::optional<std::string> {
      if (!s.check({key(round, "failed")})) return std::nullopt;
      return text(s.get(key(round, "failed")));
    });
  } catch (const LeaderLost&) {
    return lost_leader_message();
  }
}

void ElasticRendezvous::beat(int64_t round) {
  try {
    on_leader([&](c10d::TCPStore& s) { return s.add(key(round, "beat" + std::to_string(slot_)), 1); });
  } catch (const LeaderLost&) {
    // failure() says so.
  }
}

// As Note [Launcher heartbeats]; a silent leader is also taken for gone, so that the next round
// forms around another.
std::optional<int64_t> ElasticRendezvous::silent_node(int64_t round, milliseconds timeout) {
  const auto now = Clock::now();
  for (size_t n = 0; n < members_.size(); ++n) {
    if (static_cast<int64_t>(n) == slot_) continue;
    int64_t beats = 0;
    try {
      beats = on_leader([&](c10d::TCPStore& s) { return s.add(key(round, "beat" + std::to_string(n)), 0); });
    } catch (const LeaderLost&) {
      return std::nullopt;  // failure() says so
    }
    if (beats != last_beat_[n]) {
      last_beat_[n] = beats;
      last_change_[n] = now;
    } else if (now - last_change_[n] >= timeout) {
      silent_.insert(static_cast<int64_t>(n));
      if (members_[n] == leader_) {
        gone_.insert(leader_);
        leader_store_.reset();
      }
      return static_cast<int64_t>(n);
    }
  }
  return std::nullopt;
}

int64_t ElasticRendezvous::waiting_nodes(int64_t round) {
  try {
    return on_leader([&](c10d::TCPStore& s) { return s.add(key(round, "waiting"), 0); });
  } catch (const LeaderLost&) {
    return 0;
  }
}

void ElasticRendezvous::report_done(int64_t round) {
  try {
    on_leader([&](c10d::TCPStore& s) { return s.add(key(round, "done"), 1); });
  } catch (const LeaderLost&) {
  }
}

bool ElasticRendezvous::all_done(int64_t round) {
  try {
    return on_leader([&](c10d::TCPStore& s) {
      return s.add(key(round, "done"), 0) == static_cast<int64_t>(members_.size());
    });
  } catch (const LeaderLost&) {
    return false;
  }
}

void ElasticRendezvous::leave(int64_t round) {
  try {
    on_leader([&](c10d::TCPStore& s) {
      if (leader_ != me_) return s.add(key(round, "left" + std::to_string(slot_)), 1);
      // After a failure the leader goes on to the next round, its store with it; only a job that is
      // over waits for the others to have read how it ended.
      if (s.add(key(round, "done"), 0) < static_cast<int64_t>(members_.size())) return int64_t{0};
      std::vector<std::string> others;
      for (size_t n = 1; n < members_.size(); ++n)
        if (!silent_.count(static_cast<int64_t>(n))) others.push_back(key(round, "left" + std::to_string(n)));
      if (!others.empty()) s.wait(others, kLeaveTimeout);
      return int64_t{0};
    });
  } catch (const LeaderLost&) {
    // The outcome is settled; the next join() finds the next leader.
  } catch (const std::exception&) {
    // A member that does not say goodbye in time does not change the outcome.
  }
}

}  // namespace lockstep::launch
