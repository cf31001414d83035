#include "lockstep/bench/child_run.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
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
  const std::string exec_failed = "error: cannot execute '" + argv[0] + "' (not found, or not a program)\n";
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  TORCH_CHECK(pid >= 0, "cannot start '", argv[0], "': ", std::strerror(errno));
  if (pid == 0) {  // only async-signal-safe calls from here to exec
    ::setpgid(0, 0);  // its own group: a timeout kills every rank
    // Should this process die, SIGKILL included, the row gets SIGTERM and stops its ranks as it does
    // on Ctrl-C, rather than train on as an orphan.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // it died before the line above
    ::signal(SIGPIPE, SIG_DFL);                // this process ignores it
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log < 0 || ::dup2(log, STDOUT_FILENO) < 0 || ::dup2(log, STDERR_FILENO) < 0) ::_exit(127);
    ::execvpe(args[0], args.data(), envp.data());
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // as the child does: whichever runs first, the group exists before any kill(-pid)
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
    // CLI11 ends a usage error with this line; the error is the one before it.
    if (line.empty() || line.rfind("Run with --help", 0) == 0) continue;
    last = line;
    if (line.find("error") != std::string::npos) error = line;
  }
  return "exit " + std::to_string(*code) + ": " + (error.empty() ? last : error);
}

}  // namespace lockstep::bench
