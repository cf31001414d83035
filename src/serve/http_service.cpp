#include "lockstep/serve/http_service.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "lockstep/serve/http_protocol.h"
#include "service_lookup.h"

namespace lockstep::serve {
namespace {

constexpr const char* kJson = "application/json";
constexpr std::string_view kModels = "/v2/models/";
constexpr std::string_view kRepositoryModels = "/v2/repository/models/";

http::Response json_response(int status, const nlohmann::json& body) {
  http::Response r;
  r.status = status;
  r.content_type = kJson;
  r.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

// /v2/models/{model}[/versions/{version}][/{action}], split.
struct ModelPath {
  std::string model, version, action;  // action: "", "ready", "stats", "config" or "infer"
};

std::optional<ModelPath> model_path(std::string_view rest) {
  std::vector<std::string> parts;
  for (size_t slash; (slash = rest.find('/')) != std::string_view::npos; rest.remove_prefix(slash + 1))
    parts.emplace_back(rest.substr(0, slash));
  parts.emplace_back(rest);
  for (const std::string& p : parts)
    if (p.empty()) return std::nullopt;
  ModelPath m{parts[0], "", ""};
  size_t next = 1;
  if (parts.size() >= 3 && parts[1] == "versions") {
    m.version = parts[2];
    next = 3;
  }
  if (next + 1 == parts.size()) m.action = parts[next];
  const bool known = m.action == "" || m.action == "ready" || m.action == "stats" || m.action == "config" ||
                     m.action == "infer";
  if (parts.size() > next + 1 || !known) return std::nullopt;
  return m;
}

std::optional<size_t> header_length(const http::Request& req) {
  const std::string* value = req.header("inference-header-content-length");
  if (value == nullptr) return std::nullopt;
  if (value->empty() || value->size() > 12 || value->find_first_not_of("0123456789") != std::string::npos)
    throw HttpError(400, "Inference-Header-Content-Length '" + *value + "' is not a byte count");
  return static_cast<size_t>(std::stoull(*value));
}

http::Response infer(const Target& t, const http::Request& req) {
  const std::string* type = req.header("content-type");
  if (type != nullptr && type->rfind("multipart/form-data", 0) == 0)
    throw HttpError(400, "a multipart/form-data body is not an infer request; send JSON (with binary data after it: "
                         "Inference-Header-Content-Length)");
  return counted_request(*t.version, [&] {
    const ModelConfig& config = *t.model->config;
    const InferRequest request = parse_infer_request(req.body, header_length(req), config);
    const Tensors outputs = t.version->batcher->submit(request.inputs).get();
    InferResponse response = make_infer_response(request, config, t.version->version, outputs);
    http::Response r;
    r.content_type = response.content_type;
    r.body = std::move(response.body);
    if (response.header_length)
      r.headers.emplace_back("Inference-Header-Content-Length", std::to_string(*response.header_length));
    return r;
  });
}

nlohmann::json stats_of(const ServedModel& model, const ServedVersion* only) {
  nlohmann::json list = nlohmann::json::array();
  for (const ServedVersion& v : model.versions)
    if (only == nullptr || only == &v) list.push_back(v.statistics->to_json(model.name, std::to_string(v.version)));
  return list;
}

http::Response model_route(const ServiceState& state, const http::Request& req, const ModelPath& path) {
  const Target t = find_target(state, path.model, path.version);
  if (path.action == "infer") return infer(t, req);
  if (path.action == "ready") {
    if (state.shutting_down) throw HttpError(503, "the server is shutting down");
    return json_response(200, {{"name", t.model->name}, {"ready", true}});
  }
  if (path.action == "stats")
    return json_response(200, {{"model_stats", stats_of(*t.model, path.version.empty() ? nullptr : t.version)}});
  if (path.action == "config") return json_response(200, model_config_json(*t.model->config));
  std::vector<int64_t> versions;
  for (const ServedVersion& v : t.model->versions)
    if (path.version.empty() || &v == t.version) versions.push_back(v.version);
  return json_response(200, model_metadata(*t.model->config, versions));
}

// POST /v2/repository/models/{m}/load or /unload, with an optional JSON body whose "parameters" may
// hold a load's "config" override (the configuration as a JSON string, used in place of
// config.pbtxt) and "unload_dependents" (no ensembles here: nothing depends on a model). Triton's
// "file:" overrides (model files in the request) are refused: the versions are the repository's.
http::Response control_route(ServiceState& state, const http::Request& req, std::string_view rest) {
  const size_t slash = rest.rfind('/');
  const std::string name(rest.substr(0, slash == std::string_view::npos ? 0 : slash));
  const std::string_view action = slash == std::string_view::npos ? rest : rest.substr(slash + 1);
  if (name.empty() || name.find('/') != std::string::npos || (action != "load" && action != "unload"))
    throw HttpError(404, "no endpoint " + req.method + " " + req.path);
  std::optional<std::string> config;
  if (!req.body.empty()) {
    const nlohmann::json body = nlohmann::json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (!body.is_object()) throw HttpError(400, "a load or unload body is a JSON object, e.g. {\"parameters\": {}}");
    const auto parameters = body.find("parameters");
    if (parameters != body.end() && !parameters->is_object())
      throw HttpError(400, "\"parameters\" must be an object, got " + parameters->dump());
    if (parameters != body.end())
      for (const auto& item : parameters->items()) {
        if (item.key() == "config" && action == "load") {
          if (!item.value().is_string())
            throw HttpError(400, "parameter \"config\" is the model configuration as a JSON string, got " +
                                     std::string(item.value().type_name()));
          config = item.value().get<std::string>();
        } else if (item.key() != "unload_dependents") {
          refuse_control_parameter(item.key());
        }
      }
  }
  control_model(state, name, action == "load", config);
  return json_response(200, nlohmann::json::object());
}

http::Response route(ServiceState& state, const http::Request& req) {
  const std::string& p = req.path;
  const bool get = req.method == "GET", post = req.method == "POST";
  // The status is the answer (Triton's clients read only it); the body is the KServe v2 spec's
  // {"live": true} / {"ready": true}, which KServe's own REST client parses.
  if (get && p == "/v2/health/live") return json_response(200, {{"live", true}});
  if (get && p == "/v2/health/ready") {
    check_ready(state);
    return json_response(200, {{"ready", true}});
  }
  check_bearer(state.auth_token, req.header("authorization"));
  if (get && p == "/v2") return json_response(200, server_metadata());
  if (get && p == "/v2/models/stats") {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& m : state.repository.models())
      for (const nlohmann::json& s : stats_of(*m, nullptr)) all.push_back(s);
    return json_response(200, {{"model_stats", all}});
  }
  if (post && p == "/v2/repository/index") {
    nlohmann::json index = nlohmann::json::array();
    for (const IndexEntry& e : repository_index(state)) {
      nlohmann::json row{{"name", e.name}};
      if (!e.version.empty()) row["version"] = e.version;
      row["state"] = e.state;
      if (!e.reason.empty()) row["reason"] = e.reason;
      index.push_back(row);
    }
    return json_response(200, index);
  }
  if (post && p.rfind(kRepositoryModels, 0) == 0)
    return control_route(state, req, std::string_view(p).substr(kRepositoryModels.size()));
  if (p.rfind(kModels, 0) == 0)
    if (const auto path = model_path(std::string_view(p).substr(kModels.size())))
      if ((path->action == "infer") == post && (post || get)) return model_route(state, req, *path);
  throw HttpError(404, "no endpoint " + req.method + " " + p);
}

// Runs `handler`, turning what it throws into the error response.
template <typename F>
http::Response guarded(F&& handler) {
  try {
    return handler();
  } catch (const std::exception&) {
    const Refusal refused = refusal(std::current_exception());
    http::Response r = error_response(refused.status, refused.message);
    if (refused.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"lockstep\"");
    return r;
  }
}

}  // namespace

http::Response error_response(int status, const std::string& message) {
  http::Response r;
  r.status = status;
  r.content_type = kJson;
  r.body = error_body(message);
  return r;
}

http::Handler inference_handler(ServiceState& state) {
  return [&state](const http::Request& req) { return guarded([&] { return route(state, req); }); };
}

http::Handler metrics_handler(const ModelRepository& repository, std::string auth_token) {
  return [&repository, token = std::move(auth_token)](const http::Request& req) {
    return guarded([&] {
      check_bearer(token, req.header("authorization"));
      if (req.method != "GET" || req.path != "/metrics") throw HttpError(404, "no endpoint " + req.method + " " + req.path);
      std::vector<LabelledSnapshot> versions;
      for (const auto& m : repository.models())
        for (const ServedVersion& v : m->versions)
          versions.push_back({m->name, std::to_string(v.version), v.statistics->snapshot()});
      http::Response r;
      r.content_type = "text/plain; version=0.0.4";
      r.body = prometheus_text(versions);
      return r;
    });
  };
}

}  // namespace lockstep::serve
