#pragma once
// The KServe v2 REST endpoints on an httplib::Server, backed by a model repository.

#include <atomic>

#include "lockstep/serve/model_repository.h"

namespace httplib {
class Server;
}

namespace lockstep::serve {

// What the endpoints read besides the repository.
struct ServiceState {
  explicit ServiceState(const ModelRepository& r) : repository(r) {}
  const ModelRepository& repository;
  std::atomic<bool> shutting_down{false};  // set on SIGTERM: /v2/health/ready answers 503
  bool strict_readiness = true;            // ready only when every model is (Triton's default)
  int64_t max_input_bytes = 0;             // the body limit, for the 413 message
};

// GET /v2/health/live, /v2/health/ready, /v2, /v2/models/{m}[/versions/{v}][/ready|/stats],
// /v2/models/stats; POST /v2/models/{m}[/versions/{v}]/infer and /v2/repository/index. Every
// error is {"error": "..."}: 400 a bad request, 404 an unknown model, version or path, 413 a body
// over the limit, 503 a model not ready or a full queue, 500 a failed forward.
void add_inference_routes(httplib::Server& server, ServiceState& state);

// GET /metrics: Prometheus text (see prometheus_text).
void add_metrics_routes(httplib::Server& server, const ModelRepository& repository);

}  // namespace lockstep::serve
