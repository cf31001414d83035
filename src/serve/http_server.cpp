#include "lockstep/serve/http_server.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "http_listen.h"

namespace lockstep::serve::http {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kListener = 0;  // the epoll key of the listening socket; connections count from 1
constexpr size_t kReadChunk = 64 * 1024;
constexpr auto kHousekeeping = std::chrono::milliseconds(50);
constexpr int kWaitMs = 100;  // how often an idle thread looks whether the server has stopped
constexpr auto kLinger = std::chrono::seconds(2);  // see Note [Lingering close]
constexpr size_t kTrimAfterBytes = size_t{1} << 20;  // see Note [Returning a request's memory]

// Note [Lingering close]
// A socket closed with unread bytes in its receive buffer sends RST, and a client that gets the RST
// before it has read the response loses the response: the 413 to a body that is still arriving,
// the 400 to a request whose rest is in flight. So a connection the server ends while the client
// may still be sending is half-closed (shutdown SHUT_WR: the response, then FIN) and what arrives
// is read and dropped until the client closes or kLinger passes.

const char* reason_phrase(int status) {
  static const std::map<int, const char*> phrases{
      {100, "Continue"}, {200, "OK"}, {400, "Bad Request"}, {401, "Unauthorized"}, {404, "Not Found"},
      {408, "Request Timeout"}, {413, "Content Too Large"}, {414, "URI Too Long"},
      {431, "Request Header Fields Too Large"}, {500, "Internal Server Error"}, {501, "Not Implemented"},
      {503, "Service Unavailable"}, {505, "HTTP Version Not Supported"}};
  const auto it = phrases.find(status);
  return it == phrases.end() ? "Status" : it->second;
}

std::string response_head(const Response& r, bool keep_alive, int minor_version) {
  std::string head = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_phrase(r.status) + "\r\n";
  if (!r.content_type.empty()) head += "Content-Type: " + r.content_type + "\r\n";
  head += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  for (const auto& [name, value] : r.headers) head += name + ": " + value + "\r\n";
  if (!keep_alive) head += "Connection: close\r\n";
  else if (minor_version == 0) head += "Connection: keep-alive\r\n";
  return head + "\r\n";
}

Response plain_error(int status, const std::string& message) {
  Response r;
  r.status = status;
  r.content_type = "text/plain";
  r.body = message + "\n";
  return r;
}

}  // namespace

// One client connection (outside the anonymous namespace: Impl holds them).
struct Connection {
  Connection(uint64_t i, int f, ParserLimits limits) : id(i), fd(f), parser(limits) {}
  ~Connection() { ::close(fd); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Whether part of a request has arrived (its time runs).
  bool partial() const { return parser.started() || !in.empty(); }
  // Answered and half-closed: what arrives is dropped until the client closes (Note [Lingering close]).
  bool lingering() const { return linger_since.has_value(); }
  void half_close() {
    ::shutdown(fd, SHUT_WR);
    linger_since = Clock::now();
  }

  uint64_t id;
  int fd;
  std::string in;  // bytes received and not yet consumed by the parser
  RequestParser parser;
  bool in_service = false;  // a thread is reading, handling or answering: the housekeeper keeps off
  bool continue_sent = false;
  Clock::time_point request_started = Clock::now(), idle_since = Clock::now();
  std::optional<Clock::time_point> linger_since;
};

// Sends `r` (one non-blocking attempt) and half-closes: see Note [Lingering close].
static void answer_and_linger(Connection& c, const Response& r) {
  const std::string bytes = response_head(r, false, 1) + r.body;
  [[maybe_unused]] const ssize_t n = ::send(c.fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  c.half_close();
}

struct HttpServer::Impl {
  Impl(Handler h, HttpServerOptions o) : handler(std::move(h)), options(std::move(o)) {}
  ~Impl() {
    if (listen_fd >= 0) ::close(listen_fd);
    if (epoll_fd >= 0) ::close(epoll_fd);
  }

  void worker();
  void accept_all();
  Connection* claim(uint64_t id);
  void serve_connection(Connection& c);
  // Handles the request `c` holds and writes the response: whether the connection stays open
  // after it, or nullopt when the response could not be written.
  std::optional<bool> answer(Connection& c);
  bool write_all(Connection& c, const std::string& head, const std::string& body);
  void release(Connection& c);
  void close(Connection& c);
  void housekeeping();
  Response error_response(int status, const std::string& message) const {
    return options.error_response ? options.error_response(status, message) : plain_error(status, message);
  }

  Handler handler;
  HttpServerOptions options;
  int listen_fd = -1;
  int epoll_fd = -1;
  int port = 0;
  bool loopback = false;  // bound to a loopback address
  std::mutex mutex;
  std::condition_variable wake;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections;
  uint64_t next_id = kListener + 1;
  std::atomic<bool> stopping{false};
  std::atomic<bool> done{false};
};

HttpServer::HttpServer(Handler handler, HttpServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(handler), std::move(options))) {
  const HttpServerOptions& o = impl_->options;
  TORCH_CHECK_VALUE(o.threads >= 1, "HttpServerOptions::threads ", o.threads, " must be at least 1");
  TORCH_CHECK_VALUE(o.max_connections >= 1, "HttpServerOptions::max_connections ", o.max_connections,
                    " must be at least 1");
  TORCH_CHECK_VALUE(o.request_timeout_s > 0 && o.idle_timeout_s > 0 && o.write_timeout_s > 0,
                    "HttpServerOptions' timeouts must be positive: request ", o.request_timeout_s, " s, idle ",
                    o.idle_timeout_s, " s, write ", o.write_timeout_s, " s");
  reserve_descriptors(o.max_connections);
  impl_->listen_fd = listen_on(o.address, o.port);
  impl_->port = bound_port(impl_->listen_fd);
  impl_->loopback = bound_to_loopback(impl_->listen_fd);
  impl_->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  TORCH_CHECK(impl_->epoll_fd >= 0, "epoll_create1: ", std::strerror(errno));
  epoll_event listener{};
  listener.events = EPOLLIN | EPOLLEXCLUSIVE;
  listener.data.u64 = kListener;
  TORCH_CHECK(epoll_ctl(impl_->epoll_fd, EPOLL_CTL_ADD, impl_->listen_fd, &listener) == 0,
              "epoll_ctl: ", std::strerror(errno));
}

HttpServer::~HttpServer() = default;

int HttpServer::port() const { return impl_->port; }

bool HttpServer::loopback_only() const { return impl_->loopback; }

void HttpServer::stop() {
  impl_->stopping = true;
  impl_->wake.notify_all();
}

void HttpServer::serve() {
  std::vector<std::thread> threads;
  for (size_t i = 0; i < impl_->options.threads; ++i) threads.emplace_back([this] { impl_->worker(); });
  impl_->housekeeping();
  for (std::thread& t : threads) t.join();
}

void HttpServer::Impl::worker() {
  epoll_event event{};
  while (!done) {
    // One event at a time: a thread that blocks in a handler holds no other connection's turn.
    if (epoll_wait(epoll_fd, &event, 1, kWaitMs) != 1) continue;
    if (event.data.u64 == kListener) {
      accept_all();
    } else if (Connection* c = claim(event.data.u64)) {
      serve_connection(*c);
    }
  }
}

void HttpServer::Impl::accept_all() {
  while (!stopping) {
    // Accepted and counted under one lock: connections are counted in the order they arrived, so
    // the one past the limit is the one that gets 503, whichever thread accepts it.
    std::lock_guard<std::mutex> lock(mutex);
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: none left (another thread may have taken it), or the listener is closed
    const int yes = 1;  // responses go out in one write: nothing should wait for a delayed ACK (Nagle)
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    if (stopping) {  // the housekeeper may already have seen the last connection close
      ::close(fd);
      return;
    }
    // One past the limit is answered 503 and lingers (Note [Lingering close]) among at most as many
    // again; beyond those, closed at once.
    const bool over = connections.size() >= options.max_connections;
    if (over && connections.size() >= 2 * options.max_connections) {
      ::close(fd);
      continue;
    }
    const uint64_t id = next_id++;
    Connection& c = *connections.emplace(id, std::make_unique<Connection>(id, fd, options.limits)).first->second;
    if (over)
      answer_and_linger(c, error_response(503, "the server has " + std::to_string(options.max_connections) +
                                                   " connections open, its limit; retry later"));
    epoll_event event{};
    event.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
    event.data.u64 = id;
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event) != 0) connections.erase(id);
  }
}

Connection* HttpServer::Impl::claim(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = connections.find(id);
  if (it == connections.end()) return nullptr;  // closed by the housekeeper since the event
  it->second->in_service = true;
  return it->second.get();
}

void HttpServer::Impl::serve_connection(Connection& c) {
  char buffer[kReadChunk];
  while (true) {
    if (!c.lingering()) c.in.erase(0, c.parser.feed(c.in));
    if (!c.lingering() && c.parser.status() == RequestParser::Status::kError) {
      // The request's end is unknown, so the connection ends; blocking for the response would let a
      // client that does not read hold this thread, so it is one attempt, as the housekeeper's.
      answer_and_linger(c, error_response(c.parser.error_status(), c.parser.error_message()));
      c.in.clear();
    }
    if (c.lingering()) {
      const ssize_t n = ::recv(c.fd, buffer, sizeof(buffer), 0);
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return release(c);
      return close(c);
    }
    if (c.parser.status() == RequestParser::Status::kComplete) {
      const std::optional<bool> keep_alive = answer(c);
      if (!keep_alive) return close(c);
      if (!*keep_alive) {  // the client may have sent more (pipelined): see Note [Lingering close]
        c.half_close();
        continue;
      }
      c.continue_sent = false;
      c.request_started = c.idle_since = Clock::now();
      continue;
    }
    if (c.parser.awaits_continue() && !c.continue_sent) {
      c.continue_sent = true;
      if (!write_all(c, "HTTP/1.1 100 Continue\r\n\r\n", "")) return close(c);
    }
    const ssize_t n = ::recv(c.fd, buffer, sizeof(buffer), 0);
    if (n > 0) {
      if (!c.partial()) c.request_started = Clock::now();
      c.in.append(buffer, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return release(c);
    } else {
      return close(c);  // the client hung up (0) or the connection failed
    }
  }
}

std::optional<bool> HttpServer::Impl::answer(Connection& c) {
  size_t bytes = 0;  // of the request's body and the response's
  std::optional<bool> keep_alive;
  {
    const Request request = c.parser.take();
    Response response;
    try {
      response = handler(request);
    } catch (const c10::Error& e) {
      response = error_response(500, e.what_without_backtrace());
    } catch (const std::exception& e) {
      response = error_response(500, e.what());
    }
    bytes = request.body.size() + response.body.size();
    keep_alive = request.keep_alive() && !response.close && !stopping;
    if (!write_all(c, response_head(response, *keep_alive, request.minor_version), response.body)) keep_alive.reset();
  }
#ifdef __GLIBC__
  if (bytes >= kTrimAfterBytes) malloc_trim(0);  // the request is freed: see Note [Returning a request's memory]
#endif
  return keep_alive;
}

bool HttpServer::Impl::write_all(Connection& c, const std::string& head, const std::string& body) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.write_timeout_s));
  size_t sent = 0;
  const size_t total = head.size() + body.size();
  while (sent < total) {
    iovec parts[2];
    int count = 0;
    if (sent < head.size()) parts[count++] = {const_cast<char*>(head.data()) + sent, head.size() - sent};
    const size_t body_sent = sent > head.size() ? sent - head.size() : 0;
    if (body_sent < body.size()) parts[count++] = {const_cast<char*>(body.data()) + body_sent, body.size() - body_sent};
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = static_cast<size_t>(count);
    const ssize_t n = ::sendmsg(c.fd, &message, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd writable{c.fd, POLLOUT, 0};
    if (left <= 0 || ::poll(&writable, 1, static_cast<int>(left)) <= 0) return false;  // a client that does not read
  }
  return true;
}

void HttpServer::Impl::release(Connection& c) {
  std::lock_guard<std::mutex> lock(mutex);
  c.in_service = false;
  epoll_event event{};
  event.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
  event.data.u64 = c.id;
  if (epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c.fd, &event) != 0) connections.erase(c.id);
}

void HttpServer::Impl::close(Connection& c) {
  std::lock_guard<std::mutex> lock(mutex);
  connections.erase(c.id);  // closing the socket takes it out of the epoll set
}

// Every kHousekeeping: times out slow requests and idle connections; once stopping, closes the
// listener and the idle connections, and ends serve() when the last connection is closed.
void HttpServer::Impl::housekeeping() {
  const auto seconds = [](double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); };
  std::unique_lock<std::mutex> lock(mutex);
  while (true) {
    wake.wait_for(lock, kHousekeeping);
    const Clock::time_point now = Clock::now();
    if (stopping && listen_fd >= 0) {
      epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
      ::close(listen_fd);
      listen_fd = -1;
    }
    for (auto it = connections.begin(); it != connections.end();) {
      Connection& c = *it->second;
      int waiting = 0;  // bytes in the socket that no thread has read yet
      const bool idle = !c.in_service && !c.partial() && ioctl(c.fd, FIONREAD, &waiting) == 0 && waiting == 0;
      if (!c.in_service && !c.lingering() && c.partial() && now - c.request_started > seconds(options.request_timeout_s))
        answer_and_linger(c, error_response(408, c10::str("the request was not complete ", options.request_timeout_s,
                                                          " s after its first byte; send it faster")));
      const bool expired = (idle && (stopping || now - c.idle_since > seconds(options.idle_timeout_s))) ||
                           (!c.in_service && c.lingering() && now - *c.linger_since > kLinger);
      it = expired ? connections.erase(it) : std::next(it);
    }
    if (stopping && connections.empty()) break;
  }
  done = true;
}

}  // namespace lockstep::serve::http
