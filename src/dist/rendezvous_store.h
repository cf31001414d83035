#pragma once
// Internal to src/dist: how the ranks of dist::init_process_group meet (rendezvous_store.cpp).

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <string>

#include "lockstep/core/world.h"

namespace lockstep::dist {

double seconds(std::chrono::milliseconds ms);

struct Endpoint {
  std::string host;
  int port = 0;
};

// HOST:PORT of a tcp://HOST:PORT init method; c10::ValueError naming a malformed one.
Endpoint parse_tcp(const std::string& url);

// Rank 0 hosts a TCPStore at `at`, the others connect within `timeout`; errors name the rank, the
// address and the fix (a port in use, a master that never answered).
c10::intrusive_ptr<c10d::Store> tcp_store(const Endpoint& at, int64_t rank, int64_t world,
                                          std::chrono::milliseconds timeout);

// Every rank adds itself to a counter and waits for all; on timeout the error says how many came.
void rendezvous(c10d::Store& store, int64_t rank, int64_t world, std::chrono::milliseconds timeout,
                const std::string& where);

// See Note [Rank 0's address under mpirun and srun]: refuses, at once, ranks that span hosts
// under a launcher that exported no MASTER_ADDR.
void check_master_addr_reaches(const WorldInfo& env, int64_t rank, int64_t world);

}  // namespace lockstep::dist
