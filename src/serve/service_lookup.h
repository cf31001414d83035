#pragma once
// What the HTTP routes (http_service.cpp) and the gRPC service (grpc_server.cpp) decide alike: the
// bearer token, which model and version a request names, readiness, the repository index and how
// a reason is shown to clients. Private to src/serve. Refusals are HttpError with the HTTP status;
// the gRPC service maps each to its status code (grpc_status_code).

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/serve/http_protocol.h"
#include "lockstep/serve/http_service.h"

namespace lockstep::serve {

// Throws HttpError(401) unless `authorization` (the Authorization header or gRPC's "authorization"
// metadata; nullptr: not sent) is "Bearer <token>", the scheme in any case (RFC 7235 section 2.1).
// Nothing to check when `token` is empty. No message repeats what was sent.
void check_bearer(const std::string& token, const std::string* authorization);

// `reason` as clients see it (see ServiceState::verbose_errors).
std::string public_reason(const ServiceState& state, const std::string& reason);

// The model and version a request names ("" version: the highest served).
struct Target {
  std::shared_ptr<const ServedModel> model;  // held until the request is answered (Note [Loading and
  const ServedVersion* version;              // unloading while serving]); `version` is one of its
};
// Throws HttpError 404 (an unknown model or version, naming what is served) or 503 (not ready, why).
Target find_target(const ServiceState& state, const std::string& model, const std::string& version);

// Runs `infer` (one request: parse, batch, respond) and records it in `version`'s statistics as a
// success or, when it throws, a failure, with the time it took.
template <typename F>
auto counted_request(const ServedVersion& version, F&& infer) {
  const auto start = std::chrono::steady_clock::now();
  auto elapsed_ns = [&] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  };
  try {
    auto result = infer();
    version.statistics->record_success(elapsed_ns());
    return result;
  } catch (...) {
    version.statistics->record_failure(elapsed_ns());
    throw;
  }
}

// What a request's handler threw (`error`, a std::exception), as the answer: the HTTP status (gRPC
// maps it: grpc_status_code) and the message. HttpError keeps its own; Unavailable (a full queue, a
// stopping batcher) is 503; anything else is a failed inference, 500.
struct Refusal {
  int status;
  std::string message;
};
Refusal refusal(std::exception_ptr error);

// Throws HttpError(503) naming why the server is not ready: shutting down, or (strict readiness) a
// model that is not.
void check_ready(const ServiceState& state);

// One row of the repository index: a model that is not ready (no version), or one of its versions.
struct IndexEntry {
  std::string name, version, state, reason;  // state: "READY" or "UNAVAILABLE"
};
std::vector<IndexEntry> repository_index(const ServiceState& state);

// A client's load (or unload) of model `name`. Throws HttpError 503 when the repository's mode does
// not allow it, 400 naming why it failed (an unknown directory, a model that does not load, one not
// loaded), as Triton answers them. `config_json`: a load's config override (ModelRepository::load_model).
void control_model(ServiceState& state, const std::string& name, bool load,
                   const std::optional<std::string>& config_json = std::nullopt);
// Throws HttpError 400 for a load or unload parameter this server does not read (Triton's "file:"
// overrides, which carry model files in the request, among them).
[[noreturn]] void refuse_control_parameter(const std::string& key);

}  // namespace lockstep::serve
