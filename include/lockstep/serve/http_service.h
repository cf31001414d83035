#pragma once
// The KServe v2 REST endpoints as a handler for http::HttpServer, backed by a model repository.

#include <atomic>
#include <string>

#include "lockstep/serve/http_server.h"
#include "lockstep/serve/model_repository.h"

namespace lockstep::serve {

// What the endpoints read besides the repository.
struct ServiceState {
  explicit ServiceState(ModelRepository& r) : repository(r) {}
  ModelRepository& repository;  // non-const: the model control endpoints load and unload
  std::atomic<bool> shutting_down{false};  // set on SIGTERM: /v2/health/ready answers 503
  bool strict_readiness = true;            // ready only when every model is (Triton's default)
  // When set, every endpoint but /v2/health/live and /v2/health/ready (the probes an orchestrator
  // sends without credentials) needs "Authorization: Bearer <auth_token>" (the scheme in any case,
  // as RFC 7235 has it); otherwise 401.
  std::string auth_token;
  // Why a model is not ready, as clients see it: with the repository's own paths relative to it
  // and any other file named by its name alone, unless verbose_errors (the server's log always has
  // the whole message). See docs/serving.md, "Security".
  bool verbose_errors = false;
};

// GET /v2/health/live, /v2/health/ready, /v2, /v2/models/{m}[/versions/{v}][/ready|/stats],
// /v2/models/stats; POST /v2/models/{m}[/versions/{v}]/infer, /v2/repository/index and
// /v2/repository/models/{m}/load|unload (Triton's model repository extension). Every
// error is {"error": "..."}: 400 a bad request, 401 no or a wrong bearer token, 404 an unknown
// model, version or path, 413 a body over the limit, 503 a model not ready or a full queue, 500 a
// failed forward.
http::Handler inference_handler(ServiceState& state);

// GET /metrics: Prometheus text (see prometheus_text); `auth_token` as ServiceState's.
http::Handler metrics_handler(const ModelRepository& repository, std::string auth_token);

// {"error": message} with `status`: the answer to requests the server refuses before routing.
http::Response error_response(int status, const std::string& message);

}  // namespace lockstep::serve
