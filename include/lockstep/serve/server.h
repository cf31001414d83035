#pragma once

#include <torch/arg.h>

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "lockstep/serve/model_repository.h"

namespace lockstep::serve {

struct ServerOptions {
  // Loopback by default, unlike Triton's all interfaces: the server has no authentication unless
  // auth_token is set, so reaching it from elsewhere is a choice (see docs/serving.md, "Security").
  TORCH_ARG(std::string, http_address) = "127.0.0.1";
  TORCH_ARG(int, http_port) = 8000;        // 0: a free port the OS picks (printed)
  TORCH_ARG(int, metrics_port) = 8002;     // 0: a free port the OS picks (printed)
  // The KServe v2 gRPC service (inference.GRPCInferenceService) beside HTTP, as Triton serves it:
  // the same models, batchers, limits, token and statistics.
  TORCH_ARG(bool, allow_grpc) = true;
  TORCH_ARG(std::string, grpc_address) = "127.0.0.1";
  TORCH_ARG(int, grpc_port) = 8001;        // 0: a free port the OS picks (printed)
  TORCH_ARG(bool, allow_metrics) = true;
  // HTTP requests handled at once (each waits for its batch on a thread); idle and slow connections
  // hold none. See Note [Bounded connections] and docs/serving.md.
  TORCH_ARG(int64_t, http_thread_count) = 64;
  // HTTP connections open at once, past which a client gets 503; and gRPC inference calls in flight
  // (they hold no thread), past which a call gets RESOURCE_EXHAUSTED.
  TORCH_ARG(int64_t, max_connections) = 1024;
  TORCH_ARG(int64_t, max_input_bytes) = int64_t{64} << 20;  // request bodies above, in any framing: 413
                                                            // (a gRPC message above: RESOURCE_EXHAUSTED)
  TORCH_ARG(double, request_timeout_s) = 30;  // from a request's first byte to its last; then 408
  TORCH_ARG(double, idle_timeout_s) = 60;     // a keep-alive connection without a request is closed
  // Non-empty: every endpoint but the health probes needs "Authorization: Bearer <auth_token>".
  TORCH_ARG(std::string, auth_token);
  TORCH_ARG(bool, verbose_errors) = false;  // filesystem paths in error responses (see ServiceState)
  TORCH_ARG(double, exit_timeout_s) = 30;  // after SIGTERM, in-flight requests have this long
  TORCH_ARG(bool, strict_readiness) = true;  // /v2/health/ready only when every model is ready
};

// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread, and so in every thread it starts afterwards
// (LibTorch's and OpenMP's pools included), so that only Server::run's signal thread receives them.
// Call it first, before loading models.
void block_shutdown_signals();

// Note [Graceful shutdown]
// On SIGTERM (or SIGINT) the server answers 503 to readiness probes, closes its listening sockets
// (new connections are refused; gRPC refuses new calls), lets every request already received run
// to its response (the batchers keep running until the HTTP threads and gRPC calls are done), then
// stops the batchers and returns 0.
// If that takes longer than exit_timeout_s, it prints how long it waited and exits with 1.
class Server {
 public:
  // Binds the HTTP (and metrics and gRPC) ports; throws c10::Error naming the address and port when one
  // cannot be bound.
  Server(ModelRepository& repository, ServerOptions options);
  ~Server();

  int http_port() const { return http_port_; }
  int metrics_port() const { return metrics_port_; }
  int grpc_port() const { return grpc_port_; }  // 0 without allow_grpc
  // What an operator should know before serving: one line when the ports listen beyond loopback
  // (0.0.0.0, ::, an interface's address) without an auth_token, so that any host that reaches
  // them may infer and read metadata and metrics; none otherwise. run() writes them to its log.
  const std::vector<std::string>& warnings() const { return warnings_; }

  // Serves until SIGTERM or SIGINT (or stop()), then shuts down as Note [Graceful shutdown] says.
  // Returns the exit code. `log` gets one line when serving starts and a few at shutdown.
  int run(std::ostream& log);
  // Starts the shutdown, as a signal does (from another thread; for embedding and tests).
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int http_port_ = 0;
  int metrics_port_ = 0;
  int grpc_port_ = 0;
  std::vector<std::string> warnings_;
};

}  // namespace lockstep::serve
