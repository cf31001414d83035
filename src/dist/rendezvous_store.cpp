// How a process group's ranks meet (see rendezvous_store.h): the c10d store every rank reaches,
// and the wait for all of them.
#include "rendezvous_store.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <c10/util/Exception.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <thread>

#include "lockstep/core/report.h"
#include "lockstep/core/tcp_store.h"

namespace lockstep::dist {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kArrivedKey = "lockstep/arrived";

}  // namespace

double seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

Endpoint parse_tcp(const std::string& url) {
  const std::string rest = url.substr(6);  // after "tcp://"
  const auto colon = rest.rfind(':');
  TORCH_CHECK_VALUE(colon != std::string::npos && colon > 0, "init_method '", url,
                    "' must be tcp://HOST:PORT");
  Endpoint e{rest.substr(0, colon), 0};
  try {
    e.port = std::stoi(rest.substr(colon + 1));
  } catch (const std::exception&) {
    TORCH_CHECK_VALUE(false, "init_method '", url, "' has no numeric port");
  }
  TORCH_CHECK_VALUE(e.port > 0 && e.port < 65536, "init_method '", url, "': port ", e.port,
                    " is not in 1-65535");
  return e;
}

c10::intrusive_ptr<c10d::Store> tcp_store(const Endpoint& at, int64_t rank, int64_t world,
                                          std::chrono::milliseconds timeout) {
  // A host that does not resolve would be retried until the timeout and then reported as a master
  // that never answered; it is refused at once, naming it. A temporary failure (EAI_AGAIN) is left
  // to the store's retries.
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int resolved = ::getaddrinfo(at.host.c_str(), nullptr, &hints, &found);
  if (found != nullptr) ::freeaddrinfo(found);
  TORCH_CHECK_VALUE(resolved != EAI_NONAME && resolved != EAI_FAIL, "rank ", rank, " of ", world,
                    ": the rendezvous host '", at.host, "' does not resolve (", ::gai_strerror(resolved),
                    "); set MASTER_ADDR (or the tcp:// host) to rank 0's host name or address");
  // See Note [Stores listen where the job is] and Note [Store requests that never end].
  if (rank == 0) {
    try {
      return host_tcp_store(at.host, at.port, timeout);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "rank 0 of ", world, ": cannot host the rendezvous on ", at.host, ":", at.port, " (",
                  error_text(e), "); the port may be in use: choose another MASTER_PORT or tcp:// port");
    }
  }
  try {
    return connect_tcp_store(at.host, at.port, timeout, timeout);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "rank ", rank, " of ", world, ": the master at ", at.host, ":", at.port,
                " never answered within ", seconds(timeout), " s (", error_text(e),
                "); check that rank 0 is running and that MASTER_ADDR/MASTER_PORT point at it");
  }
}

void rendezvous(c10d::Store& store, int64_t rank, int64_t world, std::chrono::milliseconds timeout,
                const std::string& where) {
  store.add(kArrivedKey, 1);
  const auto deadline = Clock::now() + timeout;
  auto poll = std::chrono::milliseconds(1);
  for (;;) {
    const int64_t arrived = store.add(kArrivedKey, 0);
    if (arrived >= world) return;
    TORCH_CHECK(Clock::now() < deadline, "rank ", rank, ": rendezvous at ", where, " timed out after ",
                seconds(timeout), " s: ", arrived, " of ", world,
                " ranks arrived; start the missing ranks or check WORLD_SIZE");
    std::this_thread::sleep_for(poll);  // a poll interval, not synchronisation
    poll = std::min(poll * 2, std::chrono::milliseconds(50));
  }
}

// Note [Rank 0's address under mpirun and srun]
// torchrun and `lockstep run` export MASTER_ADDR; mpirun and srun export only ranks and sizes, so
// without MASTER_ADDR every rank would look for rank 0 on 127.0.0.1: right on one host, and a
// rendezvous timeout on several, minutes later. srun's rank 0 runs on the first host of the step
// (block distribution, SLURM's default), which world_from_env takes from SLURM_STEP_NODELIST.
// mpirun gives nothing of the kind: when its variables say that the ranks span hosts (fewer
// local ranks than ranks) and MASTER_ADDR was not set, the run stops at once and says how to
// export it. The port defaults to 29500 as in PyTorch; two jobs sharing a
// host need different MASTER_PORTs.
void check_master_addr_reaches(const WorldInfo& env, int64_t rank, int64_t world) {
  if (env.master_addr_from != "default" || env.local_world_size >= env.world_size || env.source == "default") return;
  TORCH_CHECK_VALUE(false, "rank ", rank, " of ", world, ": ", env.source, " started ranks on several hosts (",
                    env.local_world_size, " of ", env.world_size, " on this one) but MASTER_ADDR is not set, so "
                    "each rank would look for rank 0 on itself (127.0.0.1); export rank 0's host to every rank: "
                    "mpirun -x MASTER_ADDR=<rank 0's host> -x MASTER_PORT=<port>, or under srun "
                    "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)");
}

}  // namespace lockstep::dist
