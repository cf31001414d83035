#include "lockstep/serve/server.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "lockstep/serve/http_server.h"
#include "lockstep/serve/http_service.h"
#include "grpc_server.h"

namespace lockstep::serve {
namespace {

constexpr int kMetricsThreads = 2;
constexpr auto kSignalPoll = std::chrono::milliseconds(100);

// SIGHUP too: a closed terminal or an ssh session that drops ends the server as SIGTERM does, with
// the requests in flight answered, instead of by the default action (exit 129, connections reset).
sigset_t shutdown_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  return set;
}

const char* signal_name(int sig) { return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "SIGHUP"; }

// The options of one of the two HTTP servers.
http::HttpServerOptions http_options(const ServerOptions& o, int port, size_t threads) {
  http::HttpServerOptions h;
  h.address = o.http_address();
  h.port = port;
  h.threads = threads;
  h.max_connections = static_cast<size_t>(o.max_connections());
  h.limits.max_body_bytes = static_cast<size_t>(o.max_input_bytes());
  h.request_timeout_s = o.request_timeout_s();
  h.idle_timeout_s = o.idle_timeout_s();
  h.error_response = error_response;
  return h;
}

// Binds; a port that is taken is named as `what`: "the HTTP port" or "the metrics port".
std::unique_ptr<http::HttpServer> listen(http::Handler handler, http::HttpServerOptions options, const char* what) {
  try {
    return std::make_unique<http::HttpServer>(std::move(handler), options);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, e.what_without_backtrace(), " (", what, "): the port is taken or the address is not this ",
                "machine's; pick another port (0: any free port)");
  }
}

// Why ports listening beyond loopback without a token are open to other hosts. `open`: for each
// address, its ports ("the HTTP port 8000").
std::string exposure_warning(const std::vector<std::pair<std::string, std::vector<std::string>>>& open) {
  std::vector<std::string> clauses;
  for (const auto& [address, ports] : open) {
    std::string list = ports.back();
    if (ports.size() > 1)
      list = c10::Join(", ", std::vector<std::string>(ports.begin(), ports.end() - 1)) + " and " + ports.back();
    clauses.push_back(list + (ports.size() > 1 ? " listen" : " listens") + " on " + address);
  }
  return c10::Join(", and ", clauses) + " (beyond loopback) without an auth token: any host that can connect may " +
         "run inference and read the models' metadata and metrics; give the server an auth token, or listen on a " +
         "loopback address such as 127.0.0.1";
}

}  // namespace

void block_shutdown_signals() {
  const sigset_t set = shutdown_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

struct Server::Impl {
  Impl(ModelRepository& r, ServerOptions o) : repository(r), options(std::move(o)), state(r) {}
  ModelRepository& repository;
  ServerOptions options;
  ServiceState state;
  std::unique_ptr<http::HttpServer> http, metrics;
  std::unique_ptr<GrpcServer> grpc;
  std::atomic<bool> stopping{false};
  std::ostream* log = nullptr;
  std::mutex mutex;
  std::condition_variable finished_cv;
  bool finished = false;
  std::thread watchdog;
};

Server::Server(ModelRepository& repository, ServerOptions options)
    : impl_(std::make_unique<Impl>(repository, std::move(options))) {
  const ServerOptions& o = impl_->options;
  TORCH_CHECK_VALUE(o.http_thread_count() >= 1, "ServerOptions::http_thread_count ", o.http_thread_count(),
                    " must be at least 1");
  TORCH_CHECK_VALUE(o.max_connections() >= 1, "ServerOptions::max_connections ", o.max_connections(),
                    " must be at least 1");
  TORCH_CHECK_VALUE(o.max_input_bytes() >= 1, "ServerOptions::max_input_bytes ", o.max_input_bytes(),
                    " must be at least 1");
  TORCH_CHECK_VALUE(o.exit_timeout_s() >= 0, "ServerOptions::exit_timeout_s ", o.exit_timeout_s(),
                    " must not be negative");
  TORCH_CHECK_VALUE(!o.allow_metrics() || o.http_port() == 0 || o.http_port() != o.metrics_port(),
                    "ServerOptions::http_port and metrics_port are both ", o.http_port(),
                    ": give the metrics a port of their own (0: any free port)");
  TORCH_CHECK_VALUE(!o.allow_grpc() || o.grpc_port() == 0 || o.grpc_address() != o.http_address() ||
                        (o.grpc_port() != o.http_port() && (!o.allow_metrics() || o.grpc_port() != o.metrics_port())),
                    "ServerOptions::grpc_port ", o.grpc_port(), " is also the HTTP or metrics port: give gRPC a ",
                    "port of its own (0: any free port)");
  impl_->state.strict_readiness = o.strict_readiness();
  impl_->state.auth_token = o.auth_token();
  impl_->state.verbose_errors = o.verbose_errors();
  impl_->http = listen(inference_handler(impl_->state),
                       http_options(o, o.http_port(), static_cast<size_t>(o.http_thread_count())), "the HTTP port");
  http_port_ = impl_->http->port();
  if (o.allow_metrics()) {
    impl_->metrics = listen(metrics_handler(repository, o.auth_token()),
                            http_options(o, o.metrics_port(), kMetricsThreads), "the metrics port");
    metrics_port_ = impl_->metrics->port();
  }
  if (o.allow_grpc()) {
    GrpcServerOptions g;
    g.address = o.grpc_address();
    g.port = o.grpc_port();
    g.max_calls = o.max_connections();
    g.max_message_bytes = static_cast<size_t>(o.max_input_bytes());
    g.idle_timeout_s = o.idle_timeout_s();
    try {
      impl_->grpc = std::make_unique<GrpcServer>(impl_->state, g);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, e.what_without_backtrace(), " (the gRPC port): the port is taken or the address is not ",
                  "this machine's; pick another port (0: any free port)");
    }
    grpc_port_ = impl_->grpc->port();
  }
  if (o.auth_token().empty()) {
    std::vector<std::pair<std::string, std::vector<std::string>>> open;
    if (!impl_->http->loopback_only()) {
      open.push_back({o.http_address(), {"the HTTP port " + std::to_string(http_port_)}});
      if (impl_->metrics) open.back().second.push_back("the metrics port " + std::to_string(metrics_port_));
    }
    if (impl_->grpc && !impl_->grpc->loopback_only()) {
      const std::string port = "the gRPC port " + std::to_string(grpc_port_);
      if (!open.empty() && o.grpc_address() == o.http_address())
        open.back().second.push_back(port);
      else
        open.push_back({o.grpc_address(), {port}});
    }
    if (!open.empty()) warnings_.push_back(exposure_warning(open));
  }
}

Server::~Server() {
  if (impl_->watchdog.joinable()) impl_->watchdog.join();
}

void Server::stop() {
  if (impl_->stopping.exchange(true)) return;
  impl_->state.shutting_down = true;
  const double timeout = impl_->options.exit_timeout_s();
  if (impl_->log != nullptr)
    *impl_->log << "lockstep serve: shutting down: refusing new connections, finishing the requests in flight "
                << "(exit timeout " << timeout << " s)" << std::endl;
  // See Note [Graceful shutdown].
  impl_->watchdog = std::thread([this, timeout] {
    std::unique_lock<std::mutex> lock(impl_->mutex);
    const auto limit = std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout));
    if (impl_->finished_cv.wait_for(lock, limit, [this] { return impl_->finished; })) return;
    if (impl_->log != nullptr)
      *impl_->log << "lockstep serve: requests still in flight after the exit timeout of " << timeout
                  << " s; exiting without them" << std::endl;
    std::_Exit(1);
  });
  impl_->http->stop();
  if (impl_->metrics) impl_->metrics->stop();
  if (impl_->grpc) impl_->grpc->stop(timeout);
}

int Server::run(std::ostream& log) {
  impl_->log = &log;
  ::signal(SIGPIPE, SIG_IGN);  // a client that hangs up must not end the server
  std::thread metrics_thread;
  if (impl_->metrics) metrics_thread = std::thread([this] { impl_->metrics->serve(); });
  std::thread grpc_thread;
  if (impl_->grpc) grpc_thread = std::thread([this] { impl_->grpc->serve(); });
  std::atomic<bool> served{false};
  std::thread signal_thread([this, &served, &log] {
    const sigset_t set = shutdown_signals();
    const timespec poll{0, std::chrono::nanoseconds(kSignalPoll).count()};
    while (!served && !impl_->stopping) {
      const int sig = sigtimedwait(&set, nullptr, &poll);
      if (sig > 0) {
        log << "lockstep serve: " << signal_name(sig) << std::endl;
        stop();
        return;
      }
    }
  });
  const std::string& address = impl_->options.http_address();
  log << "lockstep serve: KServe v2 HTTP on http://" << address << ":" << http_port_;
  if (impl_->metrics) log << ", metrics on http://" << address << ":" << metrics_port_ << "/metrics";
  if (impl_->grpc) log << ", KServe v2 gRPC on " << impl_->options.grpc_address() << ":" << grpc_port_;
  log << std::endl;
  for (const std::string& warning : warnings_) log << "lockstep serve: warning: " << warning << std::endl;
  impl_->http->serve();  // returns once stopped and every request read is answered
  served = true;
  signal_thread.join();
  if (metrics_thread.joinable()) metrics_thread.join();
  if (grpc_thread.joinable()) grpc_thread.join();  // returns once every call received is answered
  impl_->repository.stop();
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->finished = true;
  }
  impl_->finished_cv.notify_all();
  if (impl_->watchdog.joinable()) impl_->watchdog.join();
  log << "lockstep serve: stopped" << std::endl;
  return 0;
}

}  // namespace lockstep::serve
