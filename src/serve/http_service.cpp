#include "lockstep/serve/http_service.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <httplib.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <regex>
#include <string>

#include "lockstep/serve/http_protocol.h"

namespace lockstep::serve {
namespace {

constexpr const char* kJson = "application/json";
// /v2/models/{model}[/versions/{version}]: match 1 the model, match 2 the version or "".
const std::string kModelPath = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";

std::string over_limit(const ServiceState& state) {
  return "the request body is over the size limit of " + std::to_string(state.max_input_bytes) +
         " bytes (--http-max-input-size)";
}

void reply(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), kJson);
}

void reply_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(error_body(message), kJson);
}

// The model and version a request names; throws HttpError 404 (unknown) or 503 (not ready).
struct Target {
  const ServedModel* model;
  const ServedVersion* version;
};

Target find_target(const ModelRepository& repository, const httplib::Request& req) {
  const std::string name = req.matches[1];
  const std::string version = req.matches.size() > 2 ? std::string(req.matches[2]) : std::string();
  const ServedModel* model = repository.find(name);
  if (model == nullptr) {
    std::vector<std::string> names;
    for (const ServedModel& m : repository.models()) names.push_back("'" + m.name + "'");
    throw HttpError(404, "unknown model '" + name + "'; this server has " +
                             (names.empty() ? std::string("none") : c10::Join(", ", names)));
  }
  if (!model->ready) throw HttpError(503, "model '" + name + "' is not ready: " + model->reason);
  const ServedVersion* v = model->find_version(version);
  if (v == nullptr) {
    std::vector<int64_t> versions;
    for (const ServedVersion& s : model->versions) versions.push_back(s.version);
    throw HttpError(404, "model '" + name + "' has no version '" + version + "'; it serves version(s) " +
                             c10::Join(", ", versions));
  }
  return {model, v};
}

// Runs `handler`, turning what it throws into the error response.
template <typename F>
void guarded(httplib::Response& res, F&& handler) {
  try {
    handler();
  } catch (const HttpError& e) {
    reply_error(res, e.status(), e.what());
  } catch (const Unavailable& e) {
    reply_error(res, 503, e.what());
  } catch (const c10::Error& e) {
    reply_error(res, 500, std::string("inference failed: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    reply_error(res, 500, std::string("inference failed: ") + e.what());
  }
}

std::optional<size_t> header_length(const httplib::Request& req) {
  if (!req.has_header("Inference-Header-Content-Length")) return std::nullopt;
  const std::string value = req.get_header_value("Inference-Header-Content-Length");
  if (value.empty() || value.size() > 12 || value.find_first_not_of("0123456789") != std::string::npos)
    throw HttpError(400, "Inference-Header-Content-Length '" + value + "' is not a byte count");
  return static_cast<size_t>(std::stoull(value));
}

void infer(const ServiceState& state, const httplib::Request& req, const std::string& body, httplib::Response& res) {
  const auto start = std::chrono::steady_clock::now();
  const Target t = find_target(state.repository, req);
  auto elapsed_ns = [&] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  };
  try {
    const ModelConfig& config = *t.model->config;
    const InferRequest request = parse_infer_request(body, header_length(req), config);
    const torch::Tensor output = t.version->batcher->submit(request.input).get();
    const InferResponse response = make_infer_response(request, config, t.version->version, output);
    if (response.header_length)
      res.set_header("Inference-Header-Content-Length", std::to_string(*response.header_length));
    res.set_content(response.body, response.content_type);
    t.version->statistics->record_success(elapsed_ns());
  } catch (...) {
    t.version->statistics->record_failure(elapsed_ns());
    throw;
  }
}

nlohmann::json stats_of(const ServedModel& model, const ServedVersion* only) {
  nlohmann::json list = nlohmann::json::array();
  for (const ServedVersion& v : model.versions)
    if (only == nullptr || only == &v) list.push_back(v.statistics->to_json(model.name, std::to_string(v.version)));
  return list;
}

}  // namespace

void add_inference_routes(httplib::Server& server, ServiceState& state) {
  const ModelRepository& repo = state.repository;
  // Framing is checked before any body is read. A request whose length a proxy and this server
  // could read differently (two Content-Lengths that differ, or one beside chunked encoding: the
  // shape of request smuggling) is refused; only the infer route reads a chunked body itself, under
  // the size limit, since httplib would read one sent anywhere else whole, however large. Both
  // close the connection: the body stays unread.
  server.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    static const std::regex infer(kModelPath + "/infer");
    std::string framing = req.get_header_value("Transfer-Encoding");
    std::transform(framing.begin(), framing.end(), framing.begin(), [](unsigned char c) { return std::tolower(c); });
    const bool chunked = framing.find("chunked") != std::string::npos;
    const size_t lengths = req.get_header_value_count("Content-Length");
    bool differ = false;
    for (size_t i = 1; i < lengths; ++i)
      differ = differ || req.get_header_value("Content-Length", i) != req.get_header_value("Content-Length", 0);
    if ((chunked && lengths > 0) || differ) {
      res.set_header("Connection", "close");
      reply_error(res, 400, chunked ? "the request has both a Content-Length and chunked encoding; send one of them"
                                    : "the request has Content-Length headers that differ; send one");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!chunked || std::regex_match(req.path, infer)) return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("Connection", "close");
    reply_error(res, 411, "a chunked body is accepted only by /v2/models/NAME/infer; send this one with a "
                          "Content-Length");
    return httplib::Server::HandlerResponse::Handled;
  });
  server.Get("/v2/health/live", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
  server.Get("/v2/health/ready", [&state, &repo](const httplib::Request&, httplib::Response& res) {
    if (state.shutting_down) return reply_error(res, 503, "the server is shutting down");
    for (const ServedModel& m : repo.models())
      if (!m.ready && state.strict_readiness)
        return reply_error(res, 503, "model '" + m.name + "' is not ready: " + m.reason);
    res.status = 200;
  });
  server.Get("/v2", [](const httplib::Request&, httplib::Response& res) { reply(res, 200, server_metadata()); });
  server.Get("/v2/models/stats", [&repo](const httplib::Request&, httplib::Response& res) {
    nlohmann::json all = nlohmann::json::array();
    for (const ServedModel& m : repo.models())
      for (const nlohmann::json& s : stats_of(m, nullptr)) all.push_back(s);
    reply(res, 200, {{"model_stats", all}});
  });
  server.Get(kModelPath, [&repo](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      const Target t = find_target(repo, req);
      std::vector<int64_t> versions;
      for (const ServedVersion& v : t.model->versions)
        if (req.matches[2].length() == 0 || &v == t.version) versions.push_back(v.version);
      reply(res, 200, model_metadata(*t.model->config, versions));
    });
  });
  server.Get(kModelPath + "/ready", [&state, &repo](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      find_target(repo, req);
      if (state.shutting_down) throw HttpError(503, "the server is shutting down");
      res.status = 200;
    });
  });
  server.Get(kModelPath + "/stats", [&repo](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      const Target t = find_target(repo, req);
      reply(res, 200, {{"model_stats", stats_of(*t.model, req.matches[2].length() == 0 ? nullptr : t.version)}});
    });
  });
  // The body is read here rather than by httplib, which caps bodies sent as
  // application/x-www-form-urlencoded (curl -d's default) at 8 KiB and parses them as a form.
  server.Post(kModelPath + "/infer",
              [&state](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                if (req.is_multipart_form_data()) {
                  res.set_header("Connection", "close");
                  return reply_error(res, 400, "a multipart/form-data body is not an infer request; send JSON (with "
                                               "binary data after it: Inference-Header-Content-Length)");
                }
                // The limit holds in every framing: httplib checks a Content-Length, but reads a
                // chunked body to its end whatever its size.
                std::string body;
                bool over = false;
                const bool read = reader([&](const char* data, size_t size) {
                  over = body.size() + size > static_cast<size_t>(state.max_input_bytes);
                  if (!over) body.append(data, size);
                  return !over;
                });
                if (over) {
                  res.set_header("Connection", "close");  // the rest of the body is never read
                  return reply_error(res, 413, over_limit(state));
                }
                if (!read) return;  // httplib set the status (413 over the limit, 400 unreadable)
                guarded(res, [&] { infer(state, req, body, res); });
              });
  server.Post("/v2/repository/index", [&repo](const httplib::Request&, httplib::Response& res) {
    nlohmann::json index = nlohmann::json::array();
    for (const ServedModel& m : repo.models()) {
      if (!m.ready) index.push_back({{"name", m.name}, {"state", "UNAVAILABLE"}, {"reason", m.reason}});
      for (const ServedVersion& v : m.versions)
        index.push_back({{"name", m.name}, {"version", std::to_string(v.version)}, {"state", "READY"}});
    }
    reply(res, 200, index);
  });
  // httplib's own errors (no route: 404; body over the limit: 413) get the same JSON shape; a
  // handler's error already has its body.
  server.set_error_handler([&state](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) return reply_error(res, 413, over_limit(state));
    if (res.status == 404) return reply_error(res, 404, "no endpoint " + req.method + " " + req.path);
    if (res.status == 400)
      return reply_error(res, 400, "the request could not be read (a body needs a Content-Length or chunked encoding)");
    reply_error(res, res.status, "HTTP error " + std::to_string(res.status));
  });
}

void add_metrics_routes(httplib::Server& server, const ModelRepository& repository) {
  server.Get("/metrics", [&repository](const httplib::Request&, httplib::Response& res) {
    std::vector<LabelledSnapshot> versions;
    for (const ServedModel& m : repository.models())
      for (const ServedVersion& v : m.versions)
        versions.push_back({m.name, std::to_string(v.version), v.statistics->snapshot()});
    res.set_content(prometheus_text(versions), "text/plain; version=0.0.4");
  });
}

}  // namespace lockstep::serve
