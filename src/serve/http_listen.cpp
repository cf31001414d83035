// The listening socket (http_listen.h).
#include "http_listen.h"

#include <arpa/inet.h>
#include <c10/util/Exception.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace lockstep::serve::http {

void reserve_descriptors(size_t connections) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t wanted = connections + 256;  // the repository's files, the metrics server, LibTorch
  if (limit.rlim_cur >= wanted) return;
  limit.rlim_cur = std::min(wanted, limit.rlim_max);
  setrlimit(RLIMIT_NOFILE, &limit);
  TORCH_CHECK_VALUE(limit.rlim_cur >= wanted, "max_connections ", connections, " needs ", wanted,
                    " file descriptors, but this process may open ", limit.rlim_max, " (ulimit -Hn): lower it");
}

int listen_on(const std::string& address, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int lookup = getaddrinfo(address.empty() ? nullptr : address.c_str(), service.c_str(), &hints, &found);
  TORCH_CHECK(lookup == 0, "cannot listen on ", address, ":", port, ": ", gai_strerror(lookup));
  int error = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR only: a restarted server binds a port whose old connections are in TIME_WAIT,
    // but never one another server listens on (SO_REUSEPORT would let the kernel split the requests).
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
      freeaddrinfo(found);
      return fd;
    }
    error = errno;
    ::close(fd);
  }
  freeaddrinfo(found);
  TORCH_CHECK(false, "cannot listen on ", address, ":", port, ": ", std::strerror(error));
}

int bound_port(int fd) {
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  return ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

bool bound_to_loopback(int fd) {
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) return false;
  if (bound.ss_family == AF_INET)  // 127.0.0.0/8
    return (ntohl(reinterpret_cast<sockaddr_in*>(&bound)->sin_addr.s_addr) >> 24) == 127;
  if (bound.ss_family != AF_INET6) return false;
  const in6_addr& a = reinterpret_cast<sockaddr_in6*>(&bound)->sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(&a) || (IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127);
}

}  // namespace lockstep::serve::http
