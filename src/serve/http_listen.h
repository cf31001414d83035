#pragma once
// The listening socket of http_server.cpp: descriptors for the connections, bind and listen, and
// what it was bound to. Private to src/serve.

#include <cstddef>
#include <string>

namespace lockstep::serve::http {

// Enough file descriptors for `connections`: raises the soft limit towards the hard one if needed;
// throws c10::Error naming both when the hard limit is too low.
void reserve_descriptors(size_t connections);

// A non-blocking socket listening on `address` (a name or a number; empty: every interface) and
// `port` (0: a free one); throws c10::Error naming both when none of the addresses can be bound.
int listen_on(const std::string& address, int port);

// The port `fd` is bound to.
int bound_port(int fd);

// Whether `fd` is bound to a loopback address (127.0.0.0/8, ::1 or ::ffff:127.0.0.0/104), which
// other hosts cannot reach; false for a wildcard (0.0.0.0, ::) or an interface's address.
bool bound_to_loopback(int fd);

}  // namespace lockstep::serve::http
