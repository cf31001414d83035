#include "lockstep/bench/child_run.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <optional>
#include <string>

#include "../test_util.h"

namespace lockstep::bench {
namespace {

// Reads what arrives on `fd` within `timeout_ms`, "" when nothing does.
std::string read_within(int fd, int timeout_ms) {
  struct pollfd p {fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) != 1) return "";
  char buf[64] = {};
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// `lockstep bench` runs each row in a process group of its own, which a terminal's Ctrl-C or a
// `kill` of the bench does not reach. A SIGTERM to the process running run_child() must reach the
// row, and the bench end by that SIGTERM once the row is gone, not go on to the next row.
TEST(ChildRun, ASignalToTheBenchIsForwardedToItsRunAndEndsBoth) {
  testing::TempDir dir;
  const std::string fifo = dir.path() + "/pid";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // first, so the child's open succeeds
  ASSERT_GE(reader, 0);
  const pid_t bench = ::fork();
  ASSERT_GE(bench, 0);
  if (bench == 0) {  // the bench: one row, a shell that reports its pid and waits
    run_child({"sh", "-c", "echo $$ > " + fifo + " && exec sleep 30"}, {}, dir.path() + "/row.log", 60);
    ::_exit(0);  // reached only when the signal did not end run_child's caller
  }
  const std::string row = read_within(reader, 20000);
  ::close(reader);
  ASSERT_FALSE(row.empty()) << "the row did not start within 20 s";
  const pid_t row_pid = std::stoi(row);
  ASSERT_EQ(::kill(bench, SIGTERM), 0);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  pid_t waited = 0;
  while ((waited = ::waitpid(bench, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
    ::poll(nullptr, 0, 20);  // no fd announces a child's exit
  if (waited == 0) {
    ::kill(bench, SIGKILL), ::kill(row_pid, SIGKILL), ::waitpid(bench, &status, 0);
    FAIL() << "the bench did not end within 20 s of its SIGTERM";
  }
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM)
      << "the bench should end by the SIGTERM it was sent; status " << status;
  EXPECT_EQ(::kill(row_pid, 0), -1) << "the row (pid " << row_pid << ") outlived the bench";
  EXPECT_EQ(errno, ESRCH);
}

// Whether `pid` runs: it exists and is not a zombie waiting to be reaped.
bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line) || line.rfind(')') == std::string::npos) return false;
  return line[line.rfind(')') + 2] != 'Z';
}

// kill -9 of the bench gives it no chance to forward anything: the row learns of it from the kernel
// (PR_SET_PDEATHSIG, SIGTERM) and ends, instead of training on as an orphan.
TEST(ChildRun, ARowEndsWhenTheBenchIsKilled) {
  testing::TempDir dir;
  const std::string fifo = dir.path() + "/pid";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  const pid_t bench = ::fork();
  ASSERT_GE(bench, 0);
  if (bench == 0) {
    run_child({"sh", "-c", "echo $$ > " + fifo + " && exec sleep 30"}, {}, dir.path() + "/row.log", 60);
    ::_exit(0);
  }
  const std::string row = read_within(reader, 20000);
  ::close(reader);
  ASSERT_FALSE(row.empty()) << "the row did not start within 20 s";
  const pid_t row_pid = std::stoi(row);
  ASSERT_EQ(::kill(bench, SIGKILL), 0);
  ::waitpid(bench, nullptr, 0);
  const bool ended = testing::wait_until([&] { return !running(row_pid); }, std::chrono::seconds(10));
  if (!ended) ::kill(row_pid, SIGKILL);
  EXPECT_TRUE(ended) << "the row (pid " << row_pid << ") outlived the bench by 10 s";
}

// A row that fails on a flag records the flag's error, not CLI11's closing "Run with --help" line.
TEST(ChildRun, AFailedRowRecordsItsError) {
  testing::TempDir dir;
  const std::string log = dir.path() + "/row.log";
  const std::optional<int> code = run_child({LOCKSTEP_CLI, "train", "--bogus"}, {}, log, 60);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(failure(log, code, 60), "exit 2: The following argument was not expected: --bogus");
}

TEST(ChildRun, AProgramThatCannotRunIsNamedInTheLog) {
  testing::TempDir dir;
  const std::optional<int> code = run_child({"/nonexistent/program"}, {}, dir.path() + "/row.log", 60);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 127);
  EXPECT_EQ(testing::read_text(dir.path() + "/row.log"),
            "error: cannot execute '/nonexistent/program' (not found, or not a program)\n");
}

}  // namespace
}  // namespace lockstep::bench
