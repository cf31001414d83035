#pragma once
// Runs a test body on several real ranks: one thread per rank, each with its own Gloo process group
// over a TCP rendezvous on loopback, with a short timeout so a broken test fails instead of hanging.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "../test_util.h"
#include "lockstep/dist/process_group.h"

namespace lockstep::testing {

// A TCP port that was free a moment ago, outside the kernel's ephemeral range (see free_port_pair).
inline int free_port() { return free_port_pair(); }

inline dist::InitOptions loopback(int64_t rank, int64_t world, int port,
                                  std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  return dist::InitOptions().init_method("tcp://127.0.0.1:" + std::to_string(port)).rank(rank)
      .world_size(world).timeout(timeout);
}

// Calls body(rank, group) on `world` threads and rethrows the first failure.
inline void run_ranks(int64_t world, const std::function<void(int64_t, dist::ProcessGroup&)>& body,
                      std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const int port = free_port();
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        // The ranks meet within 30 s however short `timeout` is: the collectives are under test,
        // not how fast threads reach the store (a TCPStore client retries its connect at intervals).
        auto group = dist::init_process_group(
            loopback(r, world, port, timeout).rendezvous_timeout(std::max(timeout, std::chrono::milliseconds(30000))));
        body(r, *group);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace lockstep::testing
