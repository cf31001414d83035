#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/launch/unique_fd.h"

namespace lockstep::launch {

// One worker to start: who it is and its complete environment.
struct WorkerSpec {
  int64_t rank = 0;        // global rank
  int64_t local_rank = 0;  // rank on this node
  std::vector<std::string> env;  // NAME=VALUE, everything the worker sees
};

// How a worker ended.
struct WorkerExit {
  int64_t rank = 0;
  int64_t local_rank = 0;
  pid_t pid = 0;
  int exit_code = 0;  // meaningful when signal == 0
  int signal = 0;     // the signal that killed it; 0 when it exited by itself
  std::chrono::steady_clock::time_point at;  // when the launcher reaped it

  bool ok() const { return signal == 0 && exit_code == 0; }
  // "exited with code 3" or "was killed by SIGSEGV".
  std::string describe() const;
};

// A worker stopped by a signal (SIGSTOP, SIGTSTP, ...): alive, but it arrives at no collective.
struct StoppedWorker {
  int64_t rank = 0;
  int64_t local_rank = 0;
  pid_t pid = 0;
  int signal = 0;
  std::chrono::steady_clock::time_point since;  // when the launcher saw it stop
};

// "SIGTERM" for SIGTERM; "signal 42" for numbers without a name.
std::string signal_name(int signal);

// The local workers of one round: started together, supervised together, stopped together.
//
// Each worker is the leader of its own process group, so signals reach its children too (a shell
// wrapper's `sleep`, a data loader's helpers) and the launcher's terminal does not signal workers
// behind its back. Each worker also has PR_SET_PDEATHSIG=SIGKILL: if the launcher dies without
// cleaning up (SIGKILL), the kernel kills the workers it started directly.
//
// Output: every line a worker prints goes to the launcher's stdout or stderr as "[rank N] line";
// with a log directory it is also written unprefixed to DIR/rank_N.stdout and DIR/rank_N.stderr.
class WorkerGroup {
 public:
  // `executable` is a resolved path; `argv` includes argv[0]. Throws c10::Error naming the path
  // when a log file cannot be created or a process cannot be forked.
  WorkerGroup(const std::string& executable, const std::vector<std::string>& argv,
              std::vector<WorkerSpec> workers, const std::string& log_dir,
              std::chrono::milliseconds grace_period);
  // Stops whatever still runs (see stop()).
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Forwards available output and reaps exited workers, waiting at most `max_wait` (or until
  // `wake_fd` becomes readable, when given). Returns the first worker found to have failed (non-zero
  // exit or signal) during this call; when several failed, the one that exited first.
  std::optional<WorkerExit> poll(std::chrono::milliseconds max_wait, int wake_fd = -1);

  bool all_exited() const;
  size_t running() const;
  size_t size() const;

  // Ends the group: sends `signal` to every running worker's process group, waits up to the grace
  // period, then SIGKILLs every worker's process group (also the finished ones, for stray children),
  // reaps the workers and forwards their last output. Idempotent.
  void stop(int signal);
  // The same with another grace period.
  void stop(int signal, std::chrono::milliseconds grace_period);

  // The workers that have exited, in local-rank order.
  std::vector<WorkerExit> exited() const;

  // The workers stopped by a signal as of the last poll.
  std::vector<StoppedWorker> stopped() const;

  // The last lines the worker with this local rank wrote to stderr.
  std::vector<std::string> stderr_tail(int64_t local_rank) const;

 private:
  struct Worker;
  void spawn(Worker& worker, const std::string& executable, const std::vector<std::string>& argv);
  std::optional<WorkerExit> reap();
  // Waits up to `max_wait` for output on any open pipe (or `wake_fd`) and forwards what is there.
  void pump(std::chrono::milliseconds max_wait, int wake_fd);

  std::vector<std::unique_ptr<Worker>> workers_;
  UniqueFd exits_;  // epoll set of the workers' pidfds; see Note [Which worker failed first]
  std::chrono::milliseconds grace_period_;
  bool stopped_ = false;
};

}  // namespace lockstep::launch
