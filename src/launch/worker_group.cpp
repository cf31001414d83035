#include "lockstep/launch/worker_group.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "lockstep/launch/line_prefixer.h"
#include "lockstep/launch/unique_fd.h"

namespace lockstep::launch {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kTailLines = 20;                  // stderr lines kept for the failure report
constexpr milliseconds kPollSlice{20};             // longest wait before reaping again
constexpr milliseconds kReapAfterKill{5000};       // SIGKILLed processes are gone well within this
constexpr milliseconds kDrainAfterExit{1000};      // for output still held by escaped children

std::string os_error(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

UniqueFd open_log(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  TORCH_CHECK(fd.valid(), "cannot create log file ", path, ": ", os_error(errno),
              "; check that --log-dir is writable");
  return fd;
}

// Writes everything; returns 0, or the errno of the write that failed (ENOSPC on a full disk).
int write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

// A NULL-terminated char* array over strings that outlive it, as execve wants.
std::vector<char*> c_array(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// One of a worker's output streams: the pipe it writes to, its log file, and its line splitter.
struct Stream {
  UniqueFd pipe;  // read end, non-blocking; closed at EOF
  UniqueFd log;
  std::string log_path;
  size_t logged = 0;  // bytes written to the log so far
  LinePrefixer lines;

  Stream(const std::string& prefix, int out_fd, size_t tail) : lines(prefix, out_fd, tail) {}

  // A log that cannot be written (full disk, quota) is reported once, naming the file and how much
  // of it is good, and closed: the console still gets every line.
  void write_log(const char* data, size_t size) {
    if (const int err = write_all(log.get(), data, size); err != 0) {
      const std::string msg = "lockstep run: cannot write " + log_path + ": " + os_error(err) +
                              "; the file holds only the first " + std::to_string(logged) +
                              " bytes of this output (the console gets all of it); free space under --log-dir\n";
      write_all(STDERR_FILENO, msg.data(), msg.size());
      log.reset();
      return;
    }
    logged += size;
  }

  // Reads what is available; closes the pipe at EOF.
  void forward() {
    char buf[16384];
    while (pipe.valid()) {
      const ssize_t n = ::read(pipe.get(), buf, sizeof(buf));
      if (n > 0) {
        if (log.valid()) write_log(buf, static_cast<size_t>(n));
        lines.feed(std::string_view(buf, static_cast<size_t>(n)));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && errno == EAGAIN) {
        return;
      } else {
        lines.finish();
        pipe.reset();
      }
    }
  }
};

}  // namespace

struct WorkerGroup::Worker {
  WorkerSpec spec;
  pid_t pid = -1;
  UniqueFd pidfd;      // readable once the worker has exited; closed when it is reaped
  int stop_signal = 0;  // the signal that stopped it (SIGSTOP, SIGTSTP, ...) while it is stopped
  std::chrono::steady_clock::time_point stopped_since;
  std::optional<WorkerExit> exit;
  Stream out;
  Stream err;

  explicit Worker(WorkerSpec s)
      : spec(std::move(s)),
        out("[rank " + std::to_string(spec.rank) + "] ", STDOUT_FILENO, 0),
        err("[rank " + std::to_string(spec.rank) + "] ", STDERR_FILENO, kTailLines) {}
};

std::string signal_name(int signal) {
  const char* abbrev = ::sigabbrev_np(signal);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
}

std::string WorkerExit::describe() const {
  if (signal != 0) return "was killed by " + signal_name(signal);
  return "exited with code " + std::to_string(exit_code);
}

WorkerGroup::WorkerGroup(const std::string& executable, const std::vector<std::string>& argv,
                         std::vector<WorkerSpec> workers, const std::string& log_dir,
                         milliseconds grace_period)
    : grace_period_(grace_period) {
  exits_ = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
  TORCH_CHECK(exits_.valid(), "epoll_create1: ", os_error(errno));
  for (WorkerSpec& spec : workers) {
    auto w = std::make_unique<Worker>(std::move(spec));
    if (!log_dir.empty()) {
      const std::string base = log_dir + "/rank_" + std::to_string(w->spec.rank);
      w->out.log = open_log(base + ".stdout");
      w->out.log_path = base + ".stdout";
      w->err.log = open_log(base + ".stderr");
      w->err.log_path = base + ".stderr";
    }
    workers_.push_back(std::move(w));
  }
  // On a failure half-way, the destructor does not run: stop the ones already started here.
  try {
    for (auto& w : workers_) spawn(*w, executable, argv);
  } catch (...) {
    stop(SIGKILL);
    throw;
  }
}

WorkerGroup::~WorkerGroup() { stop(SIGTERM); }

void WorkerGroup::spawn(Worker& w, const std::string& executable, const std::vector<std::string>& argv) {
  int out_pipe[2];
  int err_pipe[2];
  TORCH_CHECK(::pipe2(out_pipe, O_CLOEXEC) == 0, "pipe2: ", os_error(errno));
  UniqueFd out_read(out_pipe[0]), out_write(out_pipe[1]);
  TORCH_CHECK(::pipe2(err_pipe, O_CLOEXEC) == 0, "pipe2: ", os_error(errno));
  UniqueFd err_read(err_pipe[0]), err_write(err_pipe[1]);
  UniqueFd dev_null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  TORCH_CHECK(dev_null.valid(), "cannot open /dev/null: ", os_error(errno));

  // Everything the child needs is prepared here: between fork and exec only async-signal-safe
  // calls are allowed (the launcher may have threads, e.g. the rendezvous store's).
  std::vector<char*> child_argv = c_array(argv);
  std::vector<char*> child_env = c_array(w.spec.env);
  const std::string exec_error = "lockstep run: cannot execute " + executable + ": ";
  const pid_t parent = ::getpid();

  // Signals stay blocked across fork until the child has dropped the launcher's handlers: a SIGTERM
  // that arrives in between must kill the child, not run the launcher's handler inside it.
  sigset_t all;
  sigset_t previous;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl took effect
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &dfl, nullptr);  // fails for KILL, STOP
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(dev_null.get(), STDIN_FILENO);
    ::dup2(out_write.get(), STDOUT_FILENO);
    ::dup2(err_write.get(), STDERR_FILENO);
    if (::close_range(3, ~0U, 0) != 0)
      for (int fd = 3; fd < 4096; ++fd) ::close(fd);
    ::execve(executable.c_str(), child_argv.data(), child_env.data());
    const int err = errno;
    ::write(STDERR_FILENO, exec_error.data(), exec_error.size());
    const char* reason = ::strerrordesc_np(err);
    if (reason != nullptr) ::write(STDERR_FILENO, reason, std::strlen(reason));
    ::write(STDERR_FILENO, "\n", 1);
    ::_exit(127);
  }
  const int fork_error = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  TORCH_CHECK(pid >= 0, "cannot start rank ", w.spec.rank, ": fork failed: ", os_error(fork_error));
  // Also from the parent, so that signalling the group cannot race the child's own setpgid.
  ::setpgid(pid, pid);
  w.pid = pid;
  // See Note [Which worker failed first]. Without pidfds (Linux < 5.3) exits are found by polling.
  w.pidfd = UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (w.pidfd.valid()) {
    epoll_event event{};
    event.events = EPOLLIN;
    for (size_t i = 0; i < workers_.size(); ++i)
      if (workers_[i].get() == &w) event.data.u64 = i;
    ::epoll_ctl(exits_.get(), EPOLL_CTL_ADD, w.pidfd.get(), &event);
  }
  ::fcntl(out_read.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(err_read.get(), F_SETFL, O_NONBLOCK);
  w.out.pipe = std::move(out_read);
  w.err.pipe = std::move(err_read);
}

// Note [Which worker failed first]
// When one rank fails, the others usually fail moments later (a collective's peer vanished), and
// several can be found dead in the same pass. The one to blame is the first to exit. Each worker's
// pidfd is in an epoll set, which the supervision loop waits on with the output pipes, so an exit
// wakes the launcher at once; epoll lists ready descriptors in the order they became ready, so
// workers are reaped in the order they exited, and the first failure returned is the earliest.
std::optional<WorkerExit> WorkerGroup::reap() {
  std::optional<WorkerExit> failed;
  auto reap_one = [&](Worker& w) {
    if (w.pid < 0 || w.exit) return;
    int status = 0;
    const pid_t r = ::waitpid(w.pid, &status, WNOHANG | WUNTRACED | WCONTINUED);
    if (r != w.pid) return;
    if (WIFSTOPPED(status)) {
      w.stop_signal = WSTOPSIG(status);
      w.stopped_since = std::chrono::steady_clock::now();
      return;
    }
    if (WIFCONTINUED(status)) {
      w.stop_signal = 0;
      return;
    }
    WorkerExit e;
    e.rank = w.spec.rank;
    e.local_rank = w.spec.local_rank;
    e.pid = w.pid;
    e.at = std::chrono::steady_clock::now();
    if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
    else e.exit_code = WEXITSTATUS(status);
    w.exit = e;
    w.stop_signal = 0;
    if (w.pidfd.valid()) {
      ::epoll_ctl(exits_.get(), EPOLL_CTL_DEL, w.pidfd.get(), nullptr);
      w.pidfd.reset();
    }
    if (!e.ok() && !failed) failed = e;
  };
  std::vector<epoll_event> events(std::max<size_t>(workers_.size(), 1));
  const int ready = ::epoll_wait(exits_.get(), events.data(), static_cast<int>(events.size()), 0);
  for (int i = 0; i < ready; ++i) reap_one(*workers_.at(events[static_cast<size_t>(i)].data.u64));
  for (auto& w : workers_) reap_one(*w);  // stops and continues, and exits without a pidfd
  return failed;
}

void WorkerGroup::pump(milliseconds max_wait, int wake_fd) {
  std::vector<pollfd> fds;
  std::vector<Stream*> streams;
  for (auto& w : workers_)
    for (Stream* s : {&w->out, &w->err})
      if (s->pipe.valid()) {
        fds.push_back({s->pipe.get(), POLLIN, 0});
        streams.push_back(s);
      }
  if (wake_fd >= 0) fds.push_back({wake_fd, POLLIN, 0});
  fds.push_back({exits_.get(), POLLIN, 0});
  const int n = ::poll(fds.data(), fds.size(), static_cast<int>(max_wait.count()));
  if (n <= 0) return;
  for (size_t i = 0; i < streams.size(); ++i)
    if (fds[i].revents != 0) streams[i]->forward();
}

std::optional<WorkerExit> WorkerGroup::poll(milliseconds max_wait, int wake_fd) {
  pump(std::min(max_wait, kPollSlice), wake_fd);
  return reap();
}

bool WorkerGroup::all_exited() const { return running() == 0; }

size_t WorkerGroup::running() const {
  return std::count_if(workers_.begin(), workers_.end(),
                       [](const auto& w) { return w->pid >= 0 && !w->exit; });
}

size_t WorkerGroup::size() const { return workers_.size(); }

std::vector<WorkerExit> WorkerGroup::exited() const {
  std::vector<WorkerExit> out;
  for (const auto& w : workers_)
    if (w->exit) out.push_back(*w->exit);
  return out;
}

void WorkerGroup::stop(int signal) { stop(signal, grace_period_); }

void WorkerGroup::stop(int signal, std::chrono::milliseconds grace_period) {
  if (stopped_) return;
  stopped_ = true;
  for (auto& w : workers_)
    if (w->pid >= 0 && !w->exit) ::kill(-w->pid, signal);
  const auto grace_end = Clock::now() + grace_period;
  reap();
  while (running() > 0 && Clock::now() < grace_end) {
    pump(kPollSlice, -1);
    reap();
  }
  // Also the groups of workers that already exited: their children may linger. A process group
  // id stays reserved while any member lives, so this cannot hit an unrelated process group.
  for (auto& w : workers_)
    if (w->pid >= 0) ::kill(-w->pid, SIGKILL);
  const auto reap_end = Clock::now() + kReapAfterKill;
  while (running() > 0 && Clock::now() < reap_end) {
    pump(kPollSlice, -1);
    reap();
  }
  // Output the workers wrote before dying is still in the pipes; a child that left the process
  // group (setsid) could keep a pipe open forever, hence the deadline.
  const auto drain_end = Clock::now() + kDrainAfterExit;
  auto open_pipes = [this] {
    for (auto& w : workers_)
      if (w->out.pipe.valid() || w->err.pipe.valid()) return true;
    return false;
  };
  while (open_pipes() && Clock::now() < drain_end) pump(kPollSlice, -1);
  for (auto& w : workers_) {
    w->out.pipe.reset();
    w->err.pipe.reset();
    w->out.lines.finish();
    w->err.lines.finish();
  }
}

std::vector<StoppedWorker> WorkerGroup::stopped() const {
  std::vector<StoppedWorker> out;
  for (const auto& w : workers_)
    if (w->pid >= 0 && !w->exit && w->stop_signal != 0)
      out.push_back({w->spec.rank, w->spec.local_rank, w->pid, w->stop_signal, w->stopped_since});
  return out;
}

std::vector<std::string> WorkerGroup::stderr_tail(int64_t local_rank) const {
  for (const auto& w : workers_)
    if (w->spec.local_rank == local_rank)
      return {w->err.lines.tail().begin(), w->err.lines.tail().end()};
  return {};
}

}  // namespace lockstep::launch
