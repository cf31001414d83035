#pragma once
// c10d TCPStores that never wait forever and listen only where the job is.

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <string>

namespace c10d {
class TCPStore;
}  // namespace c10d

namespace lockstep {

// Note [Store requests that never end]
// c10d's TCPStore client reads every answer without a timeout, its constructor's handshake
// included (LibTorch 2.14: a client of a port that accepts TCP and never answers waits forever,
// whatever TCPStoreOptions::timeout says). A foreign program on the port, or a launcher stopped by
// SIGSTOP, would hang the caller past every timeout it was given. So connect_tcp_store() connects
// from a thread of its own, shuts its socket down when the handshake has not answered within 3 s
// of the connection, or `request_timeout` if shorter (the constructor then throws: a live c10d
// server answers in milliseconds), and gives the socket receive
// and send timeouts of `request_timeout`, so that every later request that gets no answer fails.
// Waits (TCPStore::wait, get) poll for their own timeout first and are not cut short by it.

// A client of the store at host:port; retries the connection for `timeout` (the store's host may
// start later), each request may take `request_timeout`, and get() and wait() wait for a key the
// longer of the two. Throws c10::Error naming host:port and
// whether nothing listened or something listened but did not answer.
c10::intrusive_ptr<c10d::TCPStore> connect_tcp_store(const std::string& host, int port,
                                                     std::chrono::milliseconds timeout,
                                                     std::chrono::milliseconds request_timeout);

// Note [Stores listen where the job is]
// A TCPStore server listens on every interface, and c10d's store has no authentication and takes
// a key's length from the wire before allocating it. A job whose members meet at a loopback address
// (one host: `lockstep run --nproc-per-node N`) needs no other interface, so its store listens on
// loopback only; a job whose members meet at another address listens everywhere, as c10d does (a
// host name may resolve to another address on each host), and its ports belong behind a firewall.

// A store server on `port` for members that reach it at `host` (see the Note); `timeout` is its
// waits' default. Throws c10::Error naming the port when it is taken.
c10::intrusive_ptr<c10d::TCPStore> host_tcp_store(const std::string& host, int port,
                                                  std::chrono::milliseconds timeout);

// Whether `host` is a loopback address or "localhost" (no lookup: a name could resolve anywhere).
bool is_loopback_host(const std::string& host);

}  // namespace lockstep
