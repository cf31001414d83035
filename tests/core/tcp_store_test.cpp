#include "lockstep/core/tcp_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "../test_util.h"

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The local addresses (hex, as /proc/net/tcp{,6} writes them) listening on `port`.
std::vector<std::string> listening_on(int port) {
  char hex_port[8];
  std::snprintf(hex_port, sizeof(hex_port), "%04X", port);
  std::vector<std::string> found;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      if (state == "0A" && local.size() > 5 && local.substr(local.size() - 4) == hex_port)
        found.push_back(local.substr(0, local.size() - 5));
    }
  }
  return found;
}

// Note [Stores listen where the job is]: c10d's server listens on every interface (the probe sent
// ten bytes from another host to a single-node job's store and grew it by a gigabyte).
TEST(TcpStore, AStoreForALoopbackJobListensOnLoopbackOnly) {
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  auto server = host_tcp_store("127.0.0.1", port, seconds(5));
  EXPECT_THAT(listening_on(port), ::testing::ElementsAre("0100007F"));  // 127.0.0.1, and nothing else
  auto client = connect_tcp_store("127.0.0.1", port, seconds(5), seconds(5));
  client->set("key", {1, 2, 3});
  EXPECT_EQ(server->get("key"), (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_TRUE(is_loopback_host("localhost"));
  EXPECT_TRUE(is_loopback_host("127.3.4.5"));
  EXPECT_TRUE(is_loopback_host("::1"));
  EXPECT_FALSE(is_loopback_host("10.0.0.1"));
  EXPECT_FALSE(is_loopback_host("node0"));  // a name may resolve to another address on each host
}

TEST(TcpStore, APortThatAcceptsButNeverAnswersIsNamedAfterTheHandshakeTimeout) {
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 8), 0);  // the kernel accepts; nobody answers
  const auto start = Clock::now();
  const std::string error = testing::error_message([&] { connect_tcp_store("127.0.0.1", port, seconds(1), seconds(1)); });
  EXPECT_LT(since(start), 5.0);
  EXPECT_THAT(error, HasSubstr("127.0.0.1:" + std::to_string(port) +
                               " accepted a connection but did not answer as a c10d store within 1 s"));
  ::close(fd);
}

// A store whose host is stopped (SIGSTOP) after the client connected: c10d's client waited forever.
TEST(TcpStore, ARequestToAStoppedStoreFailsAfterTheRequestTimeout) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  testing::TempDir dir;
  testing::ChildProcess host({python, "-c",
                              "import datetime, time, torch.distributed as d\n"
                              "s = d.TCPStore('127.0.0.1', " + std::to_string(port) +
                                  ", is_master=True, wait_for_workers=False)\n"
                                  "print('up', flush=True)\ntime.sleep(120)\n"},
                             dir / "host.out");
  ASSERT_TRUE(testing::wait_until([&] { return testing::read_text(dir / "host.out").find("up") != std::string::npos; },
                                  seconds(60)))
      << testing::read_text(dir / "host.out");
  auto client = connect_tcp_store("127.0.0.1", port, seconds(10), seconds(1));
  EXPECT_EQ(client->add("n", 1), 1);
  ASSERT_EQ(::kill(host.pid(), SIGSTOP), 0);
  // SIGSTOP takes effect when the kernel next schedules the process: wait until it is stopped.
  ASSERT_TRUE(testing::wait_until(
      [&] {
        const std::string stat = testing::read_text("/proc/" + std::to_string(host.pid()) + "/stat");
        const size_t paren = stat.rfind(')');
        return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T';
      },
      seconds(5)));
  const auto start = Clock::now();
  EXPECT_ANY_THROW(client->add("n", 1));
  EXPECT_LT(since(start), 4.0);
  ::kill(host.pid(), SIGCONT);
}

}  // namespace
}  // namespace lockstep
