#include "lockstep/launch/endpoints.h"

#include <arpa/inet.h>
#include <c10/util/Exception.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "lockstep/launch/unique_fd.h"

namespace lockstep::launch {

std::pair<std::string, int> split_endpoint(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  TORCH_CHECK_VALUE(colon != std::string::npos && colon > 0, "rendezvous endpoint '", endpoint,
                    "' is not HOST:PORT");
  int port = 0;
  try {
    port = std::stoi(endpoint.substr(colon + 1));
  } catch (const std::exception&) {
  }
  TORCH_CHECK_VALUE(port > 0 && port <= 65535, "rendezvous endpoint '", endpoint, "' has no port in [1, 65535]");
  return {endpoint.substr(0, colon), port};
}

std::string ipv4_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return "";
  char out[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, out, sizeof(out));
  ::freeaddrinfo(found);
  return out;
}

std::string route_source_address(const std::string& host, int port) {
  const std::string ip = ipv4_address(host);
  TORCH_CHECK_VALUE(!ip.empty(), "rendezvous endpoint host '", host, "' does not resolve to an IPv4 address");
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, ip.c_str(), &to.sin_addr);
  sockaddr_in from{};
  socklen_t len = sizeof(from);
  TORCH_CHECK(fd.valid() && ::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0 &&
                  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&from), &len) == 0,
              "no route to rendezvous endpoint ", host, ": ", std::strerror(errno),
              "; give this node's address (ElasticRendezvousOptions::address)");
  char out[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &from.sin_addr, out, sizeof(out));
  return out;
}

// A c10d client would retry a refused connection for a whole second at least; a gone launcher
// refuses at once.
bool accepts_connections(const std::string& host, int port, std::chrono::milliseconds timeout) {
  const std::string ip = ipv4_address(host);
  if (ip.empty()) return false;
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return false;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, ip.c_str(), &to.sin_addr);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0) return true;
  if (errno != EINPROGRESS) return false;
  pollfd p{fd.get(), POLLOUT, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
  int error = 0;
  socklen_t len = sizeof(error);
  return ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0;
}

}  // namespace lockstep::launch
