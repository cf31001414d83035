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

}  // namespace
}  // namespace lockstep::bench
