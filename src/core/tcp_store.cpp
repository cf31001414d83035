#include "lockstep/core/tcp_store.h"

#include <arpa/inet.h>
#include <c10/util/Exception.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kPoll{20};
// The longest a store's handshake may take once connected: a live c10d server answers in
// milliseconds, so an endpoint silent this long is not one (or is stopped).
constexpr milliseconds kHandshakeTimeout{3000};

double seconds(milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// "ADDRESS:PORT" of the peer `fd` is connected to (an IPv4-mapped IPv6 address as IPv4); nullopt
// for what is not a connected socket.
std::optional<std::string> peer_of(int fd) {
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return std::nullopt;
  char text[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (peer.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&peer);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    port = ntohs(a->sin_port);
  } else if (peer.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&peer);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) ::inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], text, sizeof(text));
    else ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    port = ntohs(a->sin6_port);
  } else {
    return std::nullopt;
  }
  return std::string(text) + ":" + std::to_string(port);
}

// "ADDRESS:PORT" for each address `host` resolves to: the peers a client of host:port may have.
std::set<std::string> endpoints_of(const std::string& host, int port) {
  std::set<std::string> found;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &list) != 0) return found;
  for (const addrinfo* a = list; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET)
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof(text));
    else if (a->ai_family == AF_INET6)
      ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr, text, sizeof(text));
    if (text[0] != '\0') found.insert(std::string(text) + ":" + std::to_string(port));
  }
  ::freeaddrinfo(list);
  return found;
}

// This process's sockets: descriptor and inode (a descriptor number is reused, an inode is not).
std::vector<std::pair<int, ino_t>> open_sockets() {
  std::vector<std::pair<int, ino_t>> found;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return found;
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    struct stat st {};
    if (*end != '\0' || fd == ::dirfd(dir) || ::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode))
      continue;
    found.emplace_back(static_cast<int>(fd), st.st_ino);
  }
  ::closedir(dir);
  return found;
}

std::set<ino_t> socket_inodes() {
  std::set<ino_t> inodes;
  for (const auto& [fd, inode] : open_sockets()) inodes.insert(inode);
  return inodes;
}

// Sockets opened since `before` that are connected to one of `peers` (a new client's), with
// their inodes.
std::vector<std::pair<int, ino_t>> new_connections_to(const std::set<std::string>& peers, const std::set<ino_t>& before) {
  std::vector<std::pair<int, ino_t>> found;
  for (const auto& [fd, inode] : open_sockets()) {
    if (before.count(inode) != 0) continue;
    const std::optional<std::string> peer = peer_of(fd);
    if (peer && peers.count(*peer) != 0) found.emplace_back(fd, inode);
  }
  return found;
}

void set_request_timeout(int fd, milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// One connection attempt, shared by the thread that makes it and the one that watches it (both
// may outlive the caller).
struct Attempt {
  std::mutex mutex;
  std::condition_variable changed;
  bool done = false;  // the connecting thread has ended
  bool cut = false;   // a connection was silent past the handshake timeout, and was shut down
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::string error;
};

// Cuts every new connection to `peers` that stays silent for `handshake_timeout`, until the
// attempt is done: c10d retries a failed handshake until its own timeout, and each retry is cut
// too, so the connecting thread ends when that timeout does.
void watch(const std::shared_ptr<Attempt>& attempt, std::set<std::string> peers, std::set<ino_t> before,
           milliseconds handshake_timeout) {
  std::map<ino_t, Clock::time_point> connected_at;
  std::unique_lock<std::mutex> lock(attempt->mutex);
  while (!attempt->changed.wait_for(lock, kPoll, [&] { return attempt->done; })) {
    lock.unlock();
    const auto now = Clock::now();
    bool cut = false;
    for (const auto& [fd, inode] : new_connections_to(peers, before)) {
      if (now - connected_at.emplace(inode, now).first->second < handshake_timeout) continue;
      ::shutdown(fd, SHUT_RDWR);  // the handshake's read returns, and it fails
      cut = true;
    }
    lock.lock();
    if (cut && !attempt->cut) {
      attempt->cut = true;
      attempt->changed.notify_all();
    }
  }
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return ::inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

// See Note [Store requests that never end].
c10::intrusive_ptr<c10d::TCPStore> connect_tcp_store(const std::string& host, int port, milliseconds timeout,
                                                     milliseconds request_timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = false;
  options.waitWorkers = false;
  // c10d counts the connect timeout in whole seconds and gives up at once below one.
  options.timeout = std::max<milliseconds>(timeout, std::chrono::seconds(1));
  const std::set<ino_t> before = socket_inodes();
  auto attempt = std::make_shared<Attempt>();
  std::thread([attempt, host, options] {
    c10::intrusive_ptr<c10d::TCPStore> store;
    std::string error;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(host, options);
    } catch (const std::exception& e) {
      error = first_line(e.what());
      if (error.empty()) error = "connection failed";
    }
    const std::lock_guard<std::mutex> lock(attempt->mutex);
    attempt->store = std::move(store);
    attempt->error = std::move(error);
    attempt->done = true;
    attempt->changed.notify_all();
  }).detach();
  const milliseconds handshake_timeout = std::min(request_timeout, kHandshakeTimeout);
  const std::set<std::string> peers = endpoints_of(host, port);
  std::thread(watch, attempt, peers, before, handshake_timeout).detach();

  std::unique_lock<std::mutex> lock(attempt->mutex);
  attempt->changed.wait(lock, [&] { return attempt->done || attempt->cut; });
  // A cut answers the caller at once; the two threads end when c10d's retries do.
  TORCH_CHECK(!attempt->cut || attempt->store, host, ":", port,
              " accepted a connection but did not answer as a c10d store within ", seconds(handshake_timeout),
              " s: another program holds the port, or the process that hosts the store is stopped (SIGSTOP)");
  TORCH_CHECK(attempt->error.empty(), "cannot reach the store at ", host, ":", port, " within ",
              seconds(options.timeout), " s (c10d: ", attempt->error, ")");
  for (const auto& [fd, inode] : new_connections_to(peers, before)) set_request_timeout(fd, request_timeout);
  attempt->store->setTimeout(std::max(timeout, request_timeout));  // get() and wait() wait this long for a key
  return attempt->store;
}

// See Note [Stores listen where the job is].
c10::intrusive_ptr<c10d::TCPStore> host_tcp_store(const std::string& host, int port, milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = std::max<milliseconds>(timeout, std::chrono::seconds(1));
  std::string listen_host = host;
  if (is_loopback_host(host)) {
    const bool v6 = host.find(':') != std::string::npos;
    const int fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TORCH_CHECK(fd >= 0, "socket: ", std::strerror(errno));
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    sockaddr_storage address{};
    socklen_t length = 0;
    if (v6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&address);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_loopback;
      a->sin6_port = htons(static_cast<uint16_t>(port));
      length = sizeof(*a);
      listen_host = "::1";
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&address);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a->sin_port = htons(static_cast<uint16_t>(port));
      length = sizeof(*a);
      listen_host = "127.0.0.1";
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      TORCH_CHECK(false, "port ", port, " on loopback is taken (", why, ")");
    }
    options.masterListenFd = fd;  // c10d's server owns it from here
  }
  try {
    return c10::make_intrusive<c10d::TCPStore>(listen_host, options);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "port ", port, " is taken (c10d: ", first_line(e.what()), ")");
  }
}

}  // namespace lockstep
