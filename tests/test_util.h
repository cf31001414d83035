#pragma once
// Helpers shared by the test suite: scratch directories and running child commands.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/version.h>

namespace lockstep::testing {

// The message (without backtrace) of the c10::Error that `f` throws; "<no error>" when it returns.
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "<no error>";
}

// A fresh directory under TMPDIR, removed with everything in it when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "lockstep-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;  // -1 when the command died by a signal
  std::string output;  // stdout and stderr, interleaved
};

// Runs `command` with /bin/sh, capturing stdout and stderr together.
inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(pipe);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

// The Python of the tests' oracles and peers: the venv's (LOCKSTEP_PYTHON, scripts/bootstrap
// --test), whose torch must be the version these tests were compiled against, so that no float is
// compared with one another PyTorch computed. Empty when torch cannot be imported there; a
// different torch version is a broken setup, not a skip: it aborts the test run with both versions.
inline std::string python_with_torch() {
  static const std::string python = [] {
    const std::string candidate = LOCKSTEP_PYTHON;
    const CommandResult r = run_command(candidate + " -c 'import torch; print(torch.__version__.split(\"+\")[0])'");
    if (r.exit_code != 0) return std::string();
    const std::string compiled = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                                 std::to_string(TORCH_VERSION_PATCH);
    if (r.output.substr(0, r.output.find('\n')) != compiled) {
      std::fprintf(stderr, "%s has torch %s; these tests were compiled against LibTorch %s\n", candidate.c_str(),
                   r.output.c_str(), compiled.c_str());
      std::abort();
    }
    return candidate;
  }();
  return python;
}

// What a test that needs python_with_torch() says when it skips.
inline constexpr const char* kNoPythonTorch = "the venv's python cannot import torch (scripts/bootstrap --test)";

// The last line of `text` that starts with '{' (the JSON summary lockstep prints last).
inline std::string last_json_line(const std::string& text) {
  size_t end = text.size();
  while (end > 0) {
    size_t start = text.rfind('\n', end - 1);
    start = start == std::string::npos ? 0 : start + 1;
    if (start < text.size() && text[start] == '{') return text.substr(start, end - start);
    if (start == 0) break;
    end = start - 1;
  }
  return {};
}

// Polls `condition` until it holds or `timeout` passes; returns whether it held. For waiting on
// another process, where there is nothing to block on.
inline bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// The whole file, or "" when it cannot be read.
inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// True while `pid` is a live process; a zombie (exited, not yet reaped by whoever adopted it) is
// not alive.
inline bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

// A port P such that P and P + 1 were both free a moment ago (`lockstep run` uses both), drawn
// from below the kernel's ephemeral range. A port inside that range can be taken by any outgoing
// connection, including a rank's own retried connect to it: on loopback such a connect can pick
// the port it dials as its source and connect to itself (TCP simultaneous open), so the server that
// starts a moment later finds its port "already in use". That flaked a multi-node test in CI.
inline int free_port_pair() {
  auto bindable = [](int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    return ok;
  };
  int ephemeral_low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
  const int low = 10000;
  const int high = std::max(low + 1000, ephemeral_low - 1);  // P + 1 stays below the range
  std::random_device random;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int port = low + static_cast<int>(random() % static_cast<unsigned>(high - low));
    if (bindable(port) && bindable(port + 1)) return port;
  }
  return 0;
}

// A process started from `argv` (no shell), stdout and stderr both going to `output_path`, with
// `extra_env` (NAME=VALUE) added to this process's environment. Killed and reaped if it still runs
// when the object dies, so a failing test leaves nothing behind.
class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv, const std::string& output_path,
               const std::vector<std::string>& extra_env = {}) {
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    env_strings.insert(env_strings.end(), extra_env.begin(), extra_env.end());
    std::vector<char*> env;
    for (const std::string& e : env_strings) env.push_back(const_cast<char*>(e.c_str()));
    env.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, output_path.c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    if (::posix_spawnp(&pid_, args[0], &actions, nullptr, args.data(), env.data()) != 0) pid_ = -1;
    ::posix_spawn_file_actions_destroy(&actions);
  }
  ~ChildProcess() {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }

  // The exit code, or 128 + signal, once the process has ended; nullopt if it still runs after
  // `timeout`.
  std::optional<int> wait_for(std::chrono::milliseconds timeout) {
    wait_until(
        [this] {
          int status = 0;
          if (status_ || pid_ <= 0) return true;
          if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
          status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          return true;
        },
        timeout);
    return status_;
  }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

}  // namespace lockstep::testing
