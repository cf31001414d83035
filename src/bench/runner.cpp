#include "lockstep/bench/runner.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/process.h"

extern char** environ;

namespace lockstep::bench {
namespace {

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

// A TCP port that was free a moment ago, for the peer's MASTER_PORT.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 29611;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

// Runs argv with `env` added, stdout and stderr into `log_path`; the exit code, or nullopt when
// it ran longer than `timeout_s` (then it and its process group are killed).
std::optional<int> run_child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                             const std::string& log_path, double timeout_s) {
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
  ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);  // its own group: a timeout kills every rank
  ::posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  const int spawned = ::posix_spawnp(&pid, args[0], &actions, &attr, args.data(), envp.data());
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attr);
  TORCH_CHECK(spawned == 0, "cannot start '", argv[0], "': ", std::strerror(spawned));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a child has no fd to block on here
  }
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

// Reads a finished row's summary into `r`: ok, or the error; on success the fields every run
// reports (time, samples/s, peak RSS, accuracy). Returns the summary (null on failure).
nlohmann::json read_summary(log::BenchRow& r, const std::optional<int>& code, const std::string& log_path,
                            double timeout_s) {
  nlohmann::json s = last_json(log_path);
  r.ok = code == 0 && !s.is_null();
  if (!r.ok) {
    r.error = failure(log_path, code, timeout_s);
    return nullptr;
  }
  r.train_s = s.value("train_s", 0.0), r.samples_per_s = s.value("samples_per_s", 0.0);
  r.peak_rss_mib = s.value("peak_rss_mib", 0.0), r.test_acc = s.value("test_acc", 0.0);
  return s;
}

log::BenchRow lockstep_row(const BenchOptions& o, const BenchConfig& c, const std::string& log_path) {
  const int64_t batch = std::max<int64_t>(1, o.global_batch() / (c.world_size * c.accum_steps));
  std::vector<std::string> train{o.lockstep(), "train", "--quiet", "--model", o.model(), "--data", o.data(),
                                 "--limit", std::to_string(o.limit()), "--epochs", std::to_string(o.epochs()),
                                 "--batch-size", std::to_string(batch), "--accum-steps", std::to_string(c.accum_steps),
                                 "--lr", std::to_string(o.lr()), "--threads", std::to_string(c.threads)};
  train.insert(train.end(), c.args.begin(), c.args.end());
  std::vector<std::string> argv;
  if (c.world_size > 1) argv = {o.lockstep(), "run", "--nproc-per-node", std::to_string(c.world_size), "--"};
  argv.insert(argv.end(), train.begin(), train.end());
  log::BenchRow r;
  r.name = c.name, r.world_size = c.world_size, r.threads = c.threads, r.note = c.note;
  r.setup = std::to_string(c.world_size) + " x " + std::to_string(c.threads) + ", batch " + std::to_string(batch) +
            (c.accum_steps > 1 ? " x " + std::to_string(c.accum_steps) + " micro-batches" : "");
  const auto code = run_child(argv, {"OMP_NUM_THREADS=" + std::to_string(c.threads)}, log_path, o.timeout());
  const nlohmann::json s = read_summary(r, code, log_path, o.timeout());
  if (!r.ok) return r;
  r.final_loss = s.value("final_loss", 0.0);
  r.param_bytes = s.value("param_bytes", int64_t{0}), r.grad_bytes = s.value("grad_bytes", int64_t{0});
  r.optim_bytes = s.value("optim_bytes", int64_t{0});
  r.comm_bytes_per_step = s.value("sent_bytes_per_step", int64_t{0});
  return r;
}

log::BenchRow peer_row(const BenchOptions& o, const BenchConfig& c, const std::string& log_path) {
  const int64_t batch = std::max<int64_t>(1, o.global_batch() / c.world_size);
  std::vector<std::string> argv{"bash", o.peer_dir() + "/run_ddp.sh", "--model", o.model(), "--epochs",
                                std::to_string(o.epochs()), "--limit", std::to_string(o.limit()), "--batch",
                                std::to_string(batch), "--lr", std::to_string(o.lr())};
  argv.insert(argv.end(), c.peer_args.begin(), c.peer_args.end());
  log::BenchRow r;
  r.name = c.name, r.implementation = "pytorch", r.world_size = c.world_size, r.threads = c.threads;
  r.setup = std::to_string(c.world_size) + " x " + std::to_string(c.threads) + ", batch " + std::to_string(batch);
  r.note = "PyTorch 1.13 DDP on Gloo (../shared/peer); reports no loss or memory breakdown";
  const auto code = run_child(argv, {"N=" + std::to_string(c.world_size), "PORT=" + std::to_string(free_port()),
                                     "OMP_NUM_THREADS=" + std::to_string(c.threads)},
                              log_path, o.timeout());
  read_summary(r, code, log_path, o.timeout());
  if (!r.ok) return r;
  r.final_loss = NAN;
  return r;
}

std::string row_line(const log::BenchRow& r) {
  char buf[256];
  if (!r.ok) return "failed: " + r.error;
  std::snprintf(buf, sizeof(buf), "%.1f s, %.0f samples/s, peak RSS %.0f MiB, test acc %.4f", r.train_s,
                r.samples_per_s, r.peak_rss_mib, r.test_acc);
  return buf;
}

}  // namespace

void BenchOptions::validate() const {
  TORCH_CHECK_VALUE(epochs() >= 1, "--epochs ", epochs(), " must be at least 1");
  TORCH_CHECK_VALUE(limit() >= 0, "--limit ", limit(), " must be >= 0 (0: all samples)");
  TORCH_CHECK_VALUE(global_batch() >= 2, "--batch-size ", global_batch(), " must be at least 2 (it is split over ranks)");
  TORCH_CHECK_VALUE(timeout() > 0, "--timeout ", timeout(), " must be > 0 seconds");
  TORCH_CHECK_VALUE(!peer() || data() == "fashion-mnist", "--peer runs PyTorch on Fashion-MNIST, but --data is '", data(),
                    "': drop --peer or use --data fashion-mnist");
  TORCH_CHECK_VALUE(!peer() || std::filesystem::exists(peer_dir() + "/run_ddp.sh"), "--peer: no run_ddp.sh in --peer-dir '",
                    peer_dir(), "': point --peer-dir at the Python peer (../shared/peer)");
}

log::BenchResults run_bench(const BenchOptions& o, const std::vector<BenchConfig>& matrix,
                            const std::function<void(const std::string&)>& progress) {
  o.validate();
  const std::vector<BenchConfig> rows = select(matrix, o.only());
  std::filesystem::create_directories(o.out() + "/logs");
  log::BenchResults results;
  results.date = utc_now(), results.cpu = cpu_model(), results.cores = available_cores(), results.command = o.command();
  size_t total = rows.size();
  for (const BenchConfig& c : rows) total += o.peer() && c.peer ? 1 : 0;
  size_t done = 0;
  auto run = [&](const std::string& label, const std::string& log, auto&& how) {
    progress("[" + std::to_string(done + 1) + "/" + std::to_string(total) + "] " + label + " ...");
    results.rows.push_back(how(o.out() + "/logs/" + log));
    progress("[" + std::to_string(++done) + "/" + std::to_string(total) + "] " + label + ": " +
             row_line(results.rows.back()));
  };
  for (const BenchConfig& c : rows) {
    const std::string shape = " (" + std::to_string(c.world_size) + " x " + std::to_string(c.threads) + ")";
    run(c.name + shape, c.key + ".log", [&](const std::string& log) { return lockstep_row(o, c, log); });
    if (o.peer() && c.peer)
      run("pytorch " + c.name + shape, c.key + ".pytorch.log", [&](const std::string& log) { return peer_row(o, c, log); });
  }
  write_bench_outputs(results, o.out());
  return results;
}

void write_bench_outputs(const log::BenchResults& results, const std::string& dir) {
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    write_file_atomic(dir + "/" + name, std::vector<char>(text.begin(), text.end()));
  };
  write("results.json", log::to_json(results).dump(2) + "\n");
  write("results.csv", log::to_csv(results));
  write("results.md", log::to_markdown(results));
  write("throughput.svg", log::throughput_chart_svg(results));
  write("memory.svg", log::memory_chart_svg(results));
}

}  // namespace lockstep::bench
