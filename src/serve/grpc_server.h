#pragma once
// The KServe v2 gRPC service (inference.GRPCInferenceService, grpc_service.proto) over the same
// repository, batchers, statistics, limits and bearer token as the HTTP routes. Private to
// src/serve: serve::Server starts it beside the HTTP server.

#include <cstddef>
#include <memory>
#include <string>

#include "lockstep/serve/http_service.h"

namespace lockstep::serve {

struct GrpcServerOptions {
  std::string address = "127.0.0.1";
  int port = 8001;                // 0: a free port the OS picks
  // Inference calls in flight at once (parsed, queued or running; they hold no thread: see Note
  // [gRPC calls hold no thread]); past it a call gets RESOURCE_EXHAUSTED.
  int64_t max_calls = 1024;
  size_t max_message_bytes = size_t{64} << 20;  // a request message above it: RESOURCE_EXHAUSTED
  int max_streams_per_connection = 100;         // HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS
  double idle_timeout_s = 60;     // a connection without a call for this long is closed
};

class GrpcServer {
 public:
  // Binds; throws c10::Error naming the address and port when it cannot.
  GrpcServer(ServiceState& state, GrpcServerOptions options);
  ~GrpcServer();

  int port() const { return port_; }
  // Whether the address is a loopback one (127.0.0.0/8, ::1, localhost), out of other hosts' reach.
  bool loopback_only() const;
  // Blocks until stop(), then until every call already received is answered (or `drain_timeout_s`
  // of stop() has passed: those still running are cancelled).
  void serve();
  // From another thread: refuse new calls and let serve() drain.
  void stop(double drain_timeout_s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace lockstep::serve
