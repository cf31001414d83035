#include "lockstep/launch/launcher.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

#include "lockstep/core/process.h"
#include "lockstep/launch/elastic_rendezvous.h"
#include "lockstep/launch/rendezvous.h"
#include "lockstep/launch/shutdown_signals.h"
#include "lockstep/launch/worker_group.h"
#include "stall_watch.h"

extern char** environ;

namespace lockstep::launch {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kSupervisePoll{50};     // longest a worker failure goes unnoticed

milliseconds to_ms(double seconds) { return milliseconds(static_cast<int64_t>(seconds * 1000.0)); }

std::string format_seconds(double seconds) {
  std::ostringstream s;
  s << seconds << " s";
  return s.str();
}

// PROGRAM as execve needs it: a path containing '/' as given, otherwise the first executable
// match on PATH. Empty when there is none.
std::string resolve_program(const std::string& program) {
  auto executable = [](const std::string& path) {
    return ::access(path.c_str(), X_OK) == 0 && !std::filesystem::is_directory(path);
  };
  if (program.find('/') != std::string::npos) return executable(program) ? program : std::string();
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    const std::string candidate = dir + "/" + program;
    if (executable(candidate)) return candidate;
    start = end + 1;
  }
  return {};
}

std::string plural(int64_t n, const std::string& word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

// How one round ended.
struct RoundOutcome {
  enum class Kind { kSucceeded, kFailed, kSignalled } kind = Kind::kSucceeded;
  int signal = 0;       // kSignalled: what the launcher received
  std::string failure;  // kFailed: which rank failed and how, possibly on another node
};

// How a round that a node asked to join ends; not a failure (see Note [Elastic rendezvous without
// a single point of failure]).
constexpr const char* kMembershipChange = "membership change: ";
bool is_membership_change(const std::string& what) { return what.rfind(kMembershipChange, 0) == 0; }

// Note [Stopped workers]
// A worker stopped by SIGSTOP (a debugger, a mistaken `kill -STOP`, a job-control slip) neither runs
// nor exits, and the other ranks wait for it in their next collective until its timeout, which
// may be long. The launcher sees the stop (waitpid's WUNTRACED); once the worker has been stopped
// for --heartbeat-timeout, the time after which a silent launcher's node is declared failed, the
// worker is declared failed too and the round ends (SIGKILL reaches a stopped process).
std::optional<StoppedWorker> stopped_too_long(const WorkerGroup& group, milliseconds timeout) {
  for (const StoppedWorker& s : group.stopped())
    if (Clock::now() - s.since >= timeout) return s;
  return std::nullopt;
}

// Note [A launcher that was stopped]
// A launcher stopped by SIGSTOP (a debugger, a paused VM, heavy swapping) past --heartbeat-timeout
// has been declared failed by the other nodes, which went on without it. On waking it must not go
// on with the round it remembers: its store, or the leader's, still holds that round, and a leader
// that found every other node silent would form a world of its own beside theirs. A StallWatch
// (stall_watch.h) notices the gap, which a main thread merely blocked in a request does not make,
// and the launcher ends the round: an elastic node as a change of membership (it joins
// again, as a newcomer, the round the others formed; see Note [Elastic rendezvous without a single
// point of failure]), a node of a fixed job as a failure, as the other nodes took it.
std::string stalled_launcher(int64_t node, milliseconds gap, const LaunchOptions& options) {
  const double seconds = std::chrono::duration<double>(gap).count();
  std::ostringstream text;
  text << (options.elastic() ? kMembershipChange : "") << "node " << node << "'s launcher did not run for "
       << std::round(seconds * 10) / 10 << " s (stopped by SIGSTOP or a debugger, or starved), past --heartbeat-timeout "
       << options.heartbeat_timeout() << " s: the other nodes have taken it for failed"
       << (options.elastic() ? "; it joins them again as a newcomer" : "");
  return text.str();
}

}  // namespace

Launcher::Launcher(LaunchOptions options)
    : options_(std::move(options)), job_(options_.program(), options_.worker_env(), options_.rdzv_id()) {
  options_.validate();
  executable_ = resolve_program(options_.program()[0]);
  TORCH_CHECK_VALUE(!executable_.empty(), "program '", options_.program()[0],
                    "' is not an executable file and was not found on PATH");
}

int Launcher::worker_port() const {
  if (options_.master_port() != 0) return options_.master_port();
  return options_.nnodes() == 1 && !options_.elastic() ? free_tcp_port() : kDefaultMasterPort;
}

std::unique_ptr<RendezvousHandler> Launcher::make_rendezvous() const {
  const int port = options_.master_port() != 0 ? options_.master_port() : kDefaultMasterPort;
  if (!options_.elastic())
    return std::make_unique<Rendezvous>(RendezvousOptions()
                                            .nnodes(options_.nnodes())
                                            .node_rank(options_.node_rank())
                                            .master_addr(options_.master_addr())
                                            .master_port(port)
                                            .timeout(to_ms(options_.rdzv_timeout()))
                                            .job(job_));
  // Endpoints without a port meet on the workers' port + 1, as Note [Launcher rendezvous port].
  std::vector<std::string> endpoints;
  const std::string list = options_.rdzv_endpoint().empty() ? options_.master_addr() : options_.rdzv_endpoint();
  std::istringstream words(list);
  for (std::string e; std::getline(words, e, ',');)
    if (!e.empty()) endpoints.push_back(e.find(':') == std::string::npos
                                            ? e + ":" + std::to_string(port + kRendezvousPortOffset) : e);
  return std::make_unique<ElasticRendezvous>(ElasticRendezvousOptions()
                                                 .min_nodes(options_.min_nodes())
                                                 .max_nodes(options_.nnodes())
                                                 .endpoints(endpoints)
                                                 .timeout(to_ms(options_.rdzv_timeout()))
                                                 .last_call(to_ms(options_.rdzv_last_call()))
                                                 .job(job_));
}

std::vector<std::string> Launcher::worker_env(int64_t local_rank, const NodeAssignment& round, int master_port,
                                              int64_t restart) const {
  const int64_t nproc = options_.nproc_per_node();
  std::vector<std::pair<std::string, std::string>> ours{
      {"RANK", std::to_string(round.first_rank + local_rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(round.world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
      {"GROUP_RANK", std::to_string(round.node_rank)},
      {"MASTER_ADDR", round.master_addr.empty() ? options_.master_addr() : round.master_addr},
      {"MASTER_PORT", std::to_string(master_port)},
      {"TORCHELASTIC_RUN_ID", job_.id()},
      {"LOCKSTEP_RESTART_COUNT", std::to_string(restart)},
  };
  if (!options_.iface().empty()) ours.emplace_back("LOCKSTEP_SOCKET_IFNAME", options_.iface());
  // See Note [Stopping at a step boundary]: SIGTERM asks lockstep train for a checkpoint first.
  if (options_.elastic()) ours.emplace_back("LOCKSTEP_ELASTIC", "1");
  const char* omp = std::getenv("OMP_NUM_THREADS");
  if (omp == nullptr || *omp == '\0')
    ours.emplace_back("OMP_NUM_THREADS",
                      std::to_string(std::max<int64_t>(1, available_cores() / nproc)));

  std::set<std::string> replaced;
  for (const auto& [name, value] : ours) replaced.insert(name);
  for (const auto& [name, value] : options_.worker_env())  // the launcher's own variables win
    if (replaced.insert(name).second) ours.emplace_back(name, value);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (replaced.count(entry.substr(0, entry.find('='))) == 0) env.push_back(entry);
  }
  for (const auto& [name, value] : ours) env.push_back(name + "=" + value);
  return env;
}

int Launcher::run() {
  const auto say = [this](const std::string& line) { report(options_.reporter(), ReportKind::kNotice, line); };
  const milliseconds grace = to_ms(options_.grace_period());
  const milliseconds heartbeat = to_ms(options_.heartbeat_timeout());
  const std::unique_ptr<RendezvousHandler> rendezvous = make_rendezvous();
  // A round that ends for a node to join gives the workers time to finish their step and save it
  // (Note [Stopping at a step boundary]); a failure gives the grace period.
  const auto stop_workers = [&](WorkerGroup& group, const std::string& why) {
    group.stop(SIGTERM, is_membership_change(why) ? std::max(grace, heartbeat) : grace);
  };
  int64_t restart = 0;  // failures so far; a change of membership is not one
  for (int64_t round = 0;; ++round) {
    const NodeAssignment assignment = rendezvous->join(round, options_.nproc_per_node());
    round = assignment.round;
    if (options_.elastic())
      say("round " + std::to_string(round) + ": node " + std::to_string(assignment.node_rank) + " of " +
          std::to_string(assignment.nnodes) + ", ranks " + std::to_string(assignment.first_rank) + "-" +
          std::to_string(assignment.first_rank + options_.nproc_per_node() - 1) + " of " +
          std::to_string(assignment.world_size));
    const int port = worker_port();
    std::string log_dir;
    if (!options_.log_dir().empty()) {
      log_dir = options_.log_dir() + "/attempt_" + std::to_string(round);
      std::error_code ec;
      std::filesystem::create_directories(log_dir, ec);
      TORCH_CHECK(!ec, "cannot create log directory ", log_dir, ": ", ec.message());
    }
    std::vector<WorkerSpec> specs;
    for (int64_t local = 0; local < options_.nproc_per_node(); ++local)
      specs.push_back({assignment.first_rank + local, local, worker_env(local, assignment, port, restart)});

    RoundOutcome outcome;
    {
      ShutdownSignals signals;
      WorkerGroup group(executable_, options_.program(), std::move(specs), log_dir, grace);
      bool done = false;
      auto next_peer_check = Clock::now();
      // Ends the round for every node because of `what` (on this node).
      const auto fail = [&](const std::string& what) {
        const std::string first = rendezvous->report_failure(round, what);
        say(what + "; stopping " + plural(group.running(), "local worker"));
        stop_workers(group, first);
        outcome = {RoundOutcome::Kind::kFailed, 0, first};
      };
      StallWatch watch;
      while (true) {
        const std::optional<WorkerExit> failed = group.poll(kSupervisePoll, signals.fd());
        if (const milliseconds gap = watch.take_longest_gap(); rendezvous->multi_node() && gap >= heartbeat) {
          // See Note [A launcher that was stopped]: this node's own account, whatever the round's
          // first failure says.
          const std::string what = stalled_launcher(assignment.node_rank, gap, options_);
          rendezvous->report_failure(round, what);
          say(what + "; stopping " + plural(group.running(), "local worker"));
          stop_workers(group, what);
          outcome = {RoundOutcome::Kind::kFailed, 0, what};
          break;
        }
        if (const int sig = signals.take()) {
          say("received " + signal_name(sig) + "; forwarding it to " + plural(group.running(), "worker") +
              " (SIGKILL after " + format_seconds(options_.grace_period()) + ")");
          rendezvous->report_failure(round, "node " + std::to_string(assignment.node_rank) +
                                                "'s launcher received " + signal_name(sig));
          group.stop(sig);
          outcome = {RoundOutcome::Kind::kSignalled, sig, ""};
          break;
        }
        if (failed) {
          std::string what = "rank " + std::to_string(failed->rank) + " (node " +
                             std::to_string(assignment.node_rank) + ", local rank " +
                             std::to_string(failed->local_rank) + ", pid " + std::to_string(failed->pid) +
                             ") " + failed->describe();
          // Reported before it is printed: a test (or a person) that sees the line may rely on the
          // other nodes being able to know it.
          const std::string first = rendezvous->report_failure(round, what);
          say(what);
          for (const StoppedWorker& s : group.stopped())
            say("rank " + std::to_string(s.rank) + " (local rank " + std::to_string(s.local_rank) + ", pid " +
                std::to_string(s.pid) + ") is stopped by " + signal_name(s.signal) +
                ": a stopped rank never arrives at a collective, so the others time out waiting for "
                "it; look at rank " + std::to_string(s.rank) + " first (SIGCONT resumes it)");
          const size_t others = group.running();
          if (others > 0)
            say("stopping the other " + plural(others, "local worker") + " (SIGTERM, then SIGKILL after " +
                format_seconds(options_.grace_period()) + ")");
          group.stop(SIGTERM);
          const std::vector<std::string> tail = group.stderr_tail(failed->local_rank);
          if (!tail.empty()) {
            std::string text = "last " + plural(static_cast<int64_t>(tail.size()), "line") + " of rank " +
                               std::to_string(failed->rank) + "'s stderr:";
            for (const std::string& line : tail) text += "\n  " + line;
            say(text);
          }
          // A rank that ended early while the others still needed it (before their rendezvous or a
          // collective) is the likelier cause of a later failure than the rank that timed out.
          for (const WorkerExit& e : group.exited())
            if (e.ok() && e.at < failed->at)
              say("rank " + std::to_string(e.rank) + " (local rank " + std::to_string(e.local_rank) +
                  ") had exited with code 0 " + format_seconds(std::round(std::chrono::duration<double>(failed->at - e.at).count() * 10) / 10) +
                  " earlier, while the other ranks ran: a rank that ends before the others' rendezvous or last "
                  "collective leaves them waiting for it until their timeout; look at rank " + std::to_string(e.rank) + " first");
          if (first != what) say("the first failure was on another node: " + first);
          outcome = {RoundOutcome::Kind::kFailed, 0, first};
          break;
        }
        // See Note [Stopped workers]. A stopped worker is alive, so nothing else ends the round.
        if (const std::optional<StoppedWorker> s = stopped_too_long(group, heartbeat)) {
          fail("rank " + std::to_string(s->rank) + " (node " + std::to_string(assignment.node_rank) + ", local rank " +
               std::to_string(s->local_rank) + ", pid " + std::to_string(s->pid) + ") has been stopped by " +
               signal_name(s->signal) + " for " + format_seconds(options_.heartbeat_timeout()) +
               " (--heartbeat-timeout): it never arrives at a collective, so it is taken for failed");
          break;
        }
        if (!done && group.all_exited()) {
          group.stop(SIGTERM);  // nothing is running: this only collects stray children and output
          rendezvous->report_done(round);
          done = true;
        }
        if (done && rendezvous->all_done(round)) break;
        if (rendezvous->multi_node() && Clock::now() >= next_peer_check) {
          next_peer_check = Clock::now() + kHeartbeatInterval;
          rendezvous->beat(round);  // See Note [Launcher heartbeats].
          if (const std::optional<int64_t> silent = rendezvous->silent_node(round, heartbeat)) {
            fail("node " + std::to_string(*silent) + "'s launcher sent no heartbeat for " +
                 format_seconds(options_.heartbeat_timeout()) +
                 " (--heartbeat-timeout): it was killed, hangs or is cut off");
            break;
          }
          if (std::optional<std::string> remote = rendezvous->failure(round)) {
            say((is_membership_change(*remote) ? "" : "another node failed: ") + *remote + "; stopping " +
                plural(group.running(), "local worker"));
            stop_workers(group, *remote);
            outcome = {RoundOutcome::Kind::kFailed, 0, *remote};
            break;
          }
          const int64_t waiting = rendezvous->waiting_nodes(round);
          if (!done && waiting > 0 && assignment.nnodes < options_.nnodes()) {
            fail(std::string(kMembershipChange) + plural(waiting, "node") + " waiting to join a round of " +
                 plural(assignment.nnodes, "node") + " (at most " + std::to_string(options_.nnodes()) + ")");
            break;
          }
        }
      }
    }
    rendezvous->leave(round);

    switch (outcome.kind) {
      case RoundOutcome::Kind::kSucceeded:
        say((assignment.world_size == 1 ? std::string("the worker")
                                          : "all " + plural(assignment.world_size, "worker")) +
            " finished successfully after " + plural(restart, "restart"));
        return 0;
      case RoundOutcome::Kind::kSignalled:
        return 128 + outcome.signal;
      case RoundOutcome::Kind::kFailed:
        if (options_.elastic() && is_membership_change(outcome.failure)) {
          say("forming a new round with the waiting nodes");
          continue;
        }
        if (restart < options_.max_restarts()) {
          ++restart;
          say("restarting the worker group (restart " + std::to_string(restart) + " of " +
              std::to_string(options_.max_restarts()) + ")");
          continue;
        }
        say("failed: " + outcome.failure + (options_.max_restarts() > 0
                                                ? " (all " + plural(options_.max_restarts(), "restart") + " used)"
                                                : ""));
        return kWorkersFailed;
    }
  }
}

}  // namespace lockstep::launch
