#include "lockstep/bench/child_run.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <ctime>
#include <fstream>

#include "lockstep/launch/shutdown_signals.h"

extern char** environ;

namespace lockstep::bench {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

namespace {

constexpr std::chrono::seconds kStopGrace{10};  // a stopped child's time to exit before SIGKILL

struct ChildEnd {
  std::optional<int> code;  // nullopt: killed (timeout or stop)
  int stopped_by = 0;       // a signal to this process that was forwarded to the child's group
};

// Waits for `pid` (the leader of its own process group) while `signals` holds this process's
// SIGINT, SIGTERM and SIGHUP. A timeout kills the group. Such a signal is forwarded to the group,
// which gets kStopGrace to exit before it is killed: the child sits in a group of its own (so
// that a timeout reaches every rank), so without this a Ctrl-C or a `kill` of `lockstep bench`
// would leave its run going.
ChildEnd supervise(pid_t pid, double timeout_s, launch::ShutdownSignals& signals) {
  using Clock = std::chrono::steady_clock;
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  ChildEnd end;
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      end.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (const int sig = signals.take(); sig != 0 && end.stopped_by == 0) {
      end.stopped_by = sig;
      ::kill(-pid, sig);
      deadline = std::min(deadline, Clock::now() + Clock::duration(kStopGrace));
    }
    if (Clock::now() > deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    struct pollfd wake {signals.fd(), POLLIN, 0};
    ::poll(&wake, 1, 50);  // no fd tells of a child's exit here; a signal wakes it at once
  }
  if (end.stopped_by != 0) ::kill(-pid, SIGKILL);  // whatever of the group outlived its leader
  return end;
}

}  // namespace

std::optional<int> run_child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                             const std::string& log_path, double timeout_s) {
  std::optional<launch::ShutdownSignals> signals(std::in_place);  // before the child exists: none is missed
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.insert(env_strings.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (const std::string& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  ::posix_spawnattr_init(&attr);
  // Its own group (a timeout kills every rank), SIGPIPE back to its default (this process ignores it).
  ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF);
  ::posix_spawnattr_setpgroup(&attr, 0);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  ::posix_spawnattr_setsigdefault(&attr, &defaults);
  pid_t pid = -1;
  const int spawned = ::posix_spawnp(&pid, args[0], &actions, &attr, args.data(), envp.data());
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attr);
  TORCH_CHECK(spawned == 0, "cannot start '", argv[0], "': ", std::strerror(spawned));
  const ChildEnd end = supervise(pid, timeout_s, *signals);
  signals.reset();
  if (end.stopped_by != 0) {
    // Stopped, not finished: this process ends as it was told to, now that its child has.
    std::signal(end.stopped_by, SIG_DFL);
    ::raise(end.stopped_by);
  }
  return end.code;
}

// The last JSON object a run printed (lockstep's summary, maybe behind "[rank 0] "; the peer's).
nlohmann::json last_json(const std::string& log_path) {
  std::ifstream in(log_path);
  nlohmann::json found;
  for (std::string line; std::getline(in, line);) {
    const auto brace = line.find("{\"");
    if (brace == std::string::npos) continue;
    auto j = nlohmann::json::parse(line.substr(brace), nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("samples_per_s")) found = j;
  }
  return found;
}

// The run's last error line, or its last line.
std::string failure(const std::string& log_path, const std::optional<int>& code, double timeout_s) {
  if (!code) return "killed after the --timeout of " + std::to_string(static_cast<int64_t>(timeout_s)) + " s";
  std::ifstream in(log_path);
  std::string last, error;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    last = line;
    if (line.find("error") != std::string::npos) error = line;
  }
  return "exit " + std::to_string(*code) + ": " + (error.empty() ? last : error);
}

}  // namespace lockstep::bench
