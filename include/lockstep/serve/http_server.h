#pragma once
// An HTTP/1.1 server for a handler function: keep-alive, pipelining and "100 Continue", with a
// bound on everything a client controls (connections, header and body size, time).

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/serve/http_parser.h"

namespace lockstep::serve::http {

struct Response {
  int status = 200;
  std::string content_type;  // none when empty
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // besides Content-Type/-Length and Connection
  bool close = false;  // close the connection after this response
};

// Runs once per request on one of the server's threads; it may block (e.g. for a batch). What it
// throws is answered with 500.
using Handler = std::function<Response(const Request&)>;

struct HttpServerOptions {
  std::string address = "127.0.0.1";
  int port = 0;  // 0: a free port the OS picks
  // Threads running handlers. A connection holds one only while its request is read, handled and
  // answered, never while it is idle or while a client is slow to send.
  size_t threads = 4;
  // Open connections at most: a client past it gets 503 and is closed. Connections beyond the
  // threads wait, each request in turn, for a free thread (see Note [Bounded connections]).
  size_t max_connections = 1024;
  ParserLimits limits;
  double request_timeout_s = 30;  // from a request's first byte to its last: then 408 and closed
  double idle_timeout_s = 60;     // a keep-alive connection without a request: then closed
  double write_timeout_s = 30;    // a response the client does not read: then the connection is closed
  // The answer to a request refused before any handler runs (malformed, too large, too slow, one
  // connection too many); unset: the message as text/plain.
  std::function<Response(int status, const std::string& message)> error_response;
};

// Note [Bounded connections]
// A thread per connection (httplib's model) lets a few slow or idle clients hold every thread: 70
// clients sending a header line every 3 s kept 64 threads busy and the health probe waiting. Here
// all sockets are non-blocking in one epoll set, and a thread takes a connection only when bytes
// have arrived: it reads what is there, parses, and puts the connection back unless a whole
// request is in. Time is bounded per request, not per read (a request trickled over 30 s gets 408),
// idle keep-alive connections are closed after idle_timeout_s, and the number of open connections
// is capped with a 503 past it. The listen backlog is the kernel's maximum.
//
// Note [Returning a request's memory]
// glibc gives threads arenas of their own, and what a request's handling frees stays in its
// arena: a 60 MB infer request of 10^6 inputs, read into a JSON DOM of ~0.9 GB and refused, left
// that much resident in every HTTP thread that had handled one (446 MiB -> 4.4 GiB after six,
// 2026-12-01). So a thread that has answered a request whose body or response was 1 MiB or more
// calls malloc_trim(0), which gives back the free pages of every arena (~3% of the parse's time:
// ~100 ms after a 4 s parse; microseconds when there is nothing to give), after the response is
// written so that the client does not wait for it. What malloc_trim cannot reach is the top of a
// thread's arena, which glibc shrinks on free() only past its trim threshold (raised from 128 KiB
// up to 64 MiB as it unmaps large blocks): that much at most stays per arena and the next request
// there reuses it (tests/serve/server_limits_test.cpp: +33 to +130 MiB over 4 threads, +850 MiB
// before; GLIBC_TUNABLES=glibc.malloc.trim_threshold=1048576 fixes the threshold and leaves +2 MiB).
// A smaller request reuses what its thread kept.
class HttpServer {
 public:
  // Binds and listens; throws c10::Error naming the address and port when it cannot.
  HttpServer(Handler handler, HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Whether it listens on a loopback address only (127.0.0.0/8, ::1), out of other hosts' reach.
  bool loopback_only() const;
  // Serves until stop(); then answers the requests already read, closes every connection and returns.
  void serve();
  // Stops accepting connections and ends serve() once the requests in flight are answered (any
  // thread, any time, more than once).
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::serve::http
