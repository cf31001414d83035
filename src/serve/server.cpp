#include "lockstep/serve/server.h"

#include <c10/util/Exception.h>
#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "lockstep/serve/http_service.h"

namespace lockstep::serve {
namespace {

// Requests one keep-alive connection may carry before the server closes it (httplib's default, 5,
// makes a load generator reconnect every fifth request).
constexpr size_t kKeepAliveMaxCount = 10000;
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

// SO_REUSEADDR only: a restarted server binds a port whose old connections are in TIME_WAIT, but a
// second server cannot bind a port this one listens on (httplib's default adds SO_REUSEPORT, with
// which two servers share a port and the kernel splits the requests between them).
void reuse_address_only(socket_t sock) {
  int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

int bind(httplib::Server& server, const std::string& address, int port, const char* flag) {
  const int bound = port == 0 ? server.bind_to_any_port(address) : (server.bind_to_port(address, port) ? port : -1);
  TORCH_CHECK(bound > 0, "cannot listen on ", address, ":", port, " (", flag,
              "): the port is taken or the address is not this machine's; pick another ", flag, " (0: any free port)");
  return bound;
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
  httplib::Server http, metrics;
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
  TORCH_CHECK_VALUE(o.http_thread_count() >= 1, "--http-thread-count ", o.http_thread_count(), " must be at least 1");
  TORCH_CHECK_VALUE(o.max_input_bytes() >= 1, "--http-max-input-size ", o.max_input_bytes(), " must be at least 1");
  TORCH_CHECK_VALUE(o.exit_timeout_s() >= 0, "--exit-timeout ", o.exit_timeout_s(), " must not be negative");
  TORCH_CHECK_VALUE(!o.allow_metrics() || o.http_port() == 0 || o.http_port() != o.metrics_port(), "--http-port and ",
                    "--metrics-port are both ", o.http_port(), ": give the metrics a port of their own (0: any free port)");
  impl_->state.strict_readiness = o.strict_readiness();
  impl_->state.max_input_bytes = o.max_input_bytes();
  const auto threads = static_cast<size_t>(o.http_thread_count());
  impl_->http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  impl_->http.set_keep_alive_max_count(kKeepAliveMaxCount);
  // httplib writes a response's headers and body in separate sends: with Nagle's algorithm the
  // body waits for the client's delayed ACK, ~40 ms per request.
  impl_->http.set_tcp_nodelay(true);
  impl_->http.set_socket_options(reuse_address_only);
  impl_->http.set_payload_max_length(static_cast<size_t>(o.max_input_bytes()));
  add_inference_routes(impl_->http, impl_->state);
  http_port_ = bind(impl_->http, o.http_address(), o.http_port(), "--http-port");
  if (o.allow_metrics()) {
    impl_->metrics.new_task_queue = [] { return new httplib::ThreadPool(kMetricsThreads); };
    impl_->metrics.set_tcp_nodelay(true);
    impl_->metrics.set_socket_options(reuse_address_only);
    add_metrics_routes(impl_->metrics, repository);
    metrics_port_ = bind(impl_->metrics, o.http_address(), o.metrics_port(), "--metrics-port");
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
                << "(--exit-timeout " << timeout << " s)" << std::endl;
  // See Note [Graceful shutdown].
  impl_->watchdog = std::thread([this, timeout] {
    std::unique_lock<std::mutex> lock(impl_->mutex);
    const auto limit = std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout));
    if (impl_->finished_cv.wait_for(lock, limit, [this] { return impl_->finished; })) return;
    if (impl_->log != nullptr)
      *impl_->log << "lockstep serve: requests still in flight after --exit-timeout " << timeout
                  << " s; exiting without them" << std::endl;
    std::_Exit(1);
  });
  // httplib's stop() only closes a socket that listen() has started on.
  for (int i = 0; i < 2000 && !impl_->http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  impl_->http.stop();
  if (impl_->options.allow_metrics()) {
    for (int i = 0; i < 2000 && !impl_->metrics.is_running(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    impl_->metrics.stop();
  }
}

int Server::run(std::ostream& log) {
  impl_->log = &log;
  ::signal(SIGPIPE, SIG_IGN);  // a client that hangs up must not end the server
  std::thread metrics_thread;
  if (impl_->options.allow_metrics()) metrics_thread = std::thread([this] { impl_->metrics.listen_after_bind(); });
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
  if (impl_->options.allow_metrics()) log << ", metrics on http://" << address << ":" << metrics_port_ << "/metrics";
  log << std::endl;
  const bool listened = impl_->http.listen_after_bind();  // returns once stopped and every handler is done
  if (!listened) stop();
  served = true;
  signal_thread.join();
  if (metrics_thread.joinable()) metrics_thread.join();
  impl_->repository.stop();
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->finished = true;
  }
  impl_->finished_cv.notify_all();
  if (impl_->watchdog.joinable()) impl_->watchdog.join();
  log << "lockstep serve: stopped" << (listened ? "" : " (the HTTP socket failed)") << std::endl;
  return listened ? 0 : 1;
}

}  // namespace lockstep::serve
