#include "grpc_server.h"

#include <arpa/inet.h>
#include <c10/util/Exception.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>

#include "grpc_protocol.h"
#include "grpc_service.grpc.pb.h"
#include "service_lookup.h"

namespace lockstep::serve {
namespace {

// The gRPC code of a refusal the HTTP routes answer with `status`.
grpc::StatusCode grpc_status_code(int status) {
  switch (status) {
    case 400: return grpc::StatusCode::INVALID_ARGUMENT;
    case 401: return grpc::StatusCode::UNAUTHENTICATED;
    case 404: return grpc::StatusCode::NOT_FOUND;
    case 408: return grpc::StatusCode::DEADLINE_EXCEEDED;
    case 413: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case 503: return grpc::StatusCode::UNAVAILABLE;
    default: return grpc::StatusCode::INTERNAL;
  }
}

// Runs `call`, turning what it throws into the call's status, as the HTTP routes' `guarded` does
// into responses: a request never ends the server.
template <typename F>
grpc::Status grpc_guarded(F&& call) {
  try {
    call();
    return grpc::Status::OK;
  } catch (const std::exception&) {
    const Refusal refused = refusal(std::current_exception());
    return {grpc_status_code(refused.status), refused.message};
  }
}

// A call answered at once (everything but ModelInfer): `call`'s outcome finishes it.
template <typename F>
grpc::ServerUnaryReactor* answered(grpc::CallbackServerContext* context, F&& call) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc_guarded(std::forward<F>(call)));
  return reactor;
}

// Note [gRPC calls hold no thread]
// The service runs on gRPC's callback API: a ModelInfer call is parsed and queued on the thread
// gRPC delivers it on, and answered from the model instance's worker that ran its batch (Batcher's
// submit with a Done), so a thousand calls waiting for their batches hold a thousand queue entries,
// not a thousand threads. The synchronous API held a thread per call and, past its thread quota,
// answered RESOURCE_EXHAUSTED ("Server Threadpool Exhausted"): 280 of 300 async_infer calls sent at
// once against 4 threads. Calls in flight are bounded by GrpcServerOptions::max_calls instead, past
// which a call is refused with RESOURCE_EXHAUSTED naming the bound.

// The KServe v2 calls. Each checks the bearer token in the "authorization" metadata, but the two
// health calls, as HTTP's probes.
class GrpcInferenceService final
    : public inference::GRPCInferenceService::WithRawCallbackMethod_ModelInfer<
          inference::GRPCInferenceService::CallbackService> {
 public:
  GrpcInferenceService(ServiceState& state, int64_t max_calls) : state_(state), max_calls_(max_calls) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context, const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* response) override {
    return answered(context, [&] { response->set_live(true); });
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context, const inference::ServerReadyRequest*,
                                        inference::ServerReadyResponse* response) override {
    return answered(context, [&] {
      try {
        check_ready(state_);
        response->set_ready(true);
      } catch (const HttpError&) {
        response->set_ready(false);
      }
    });
  }

  // A model that is unknown or not ready is `ready: false`, as HTTP's 404 and 503 read by a client.
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override {
    return answered(context, [&] {
      authorize(*context);
      try {
        find_target(state_, request->name(), request->version());
        response->set_ready(!state_.shutting_down);
      } catch (const HttpError& e) {
        if (e.status() != 404 && e.status() != 503) throw;
        response->set_ready(false);
      }
    });
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse* response) override {
    return answered(context, [&] {
      authorize(*context);
      const nlohmann::json m = server_metadata();
      response->set_name(m["name"].get<std::string>());
      response->set_version(m["version"].get<std::string>());
      for (const nlohmann::json& e : m["extensions"]) response->add_extensions(e.get<std::string>());
    });
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override {
    return answered(context, [&] {
      authorize(*context);
      const Target t = find_target(state_, request->name(), request->version());
      std::vector<int64_t> versions;
      for (const ServedVersion& v : t.model->versions)
        if (request->version().empty() || &v == t.version) versions.push_back(v.version);
      write_model_metadata(*t.model->config, versions, *response);
    });
  }

  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* context,
                                        const inference::ModelConfigRequest* request,
                                        inference::ModelConfigResponse* response) override {
    return answered(context, [&] {
      authorize(*context);
      const Target t = find_target(state_, request->name(), request->version());
      write_model_config(*t.model->config, *response->mutable_config());
    });
  }

  // See Note [gRPC calls hold no thread]. Raw bytes in and out, so that a message that is not a
  // ModelInferRequest gets INVALID_ARGUMENT saying so (the callback API's own parse answered
  // UNIMPLEMENTED with no message). A call whose deadline passes is ended by gRPC itself
  // (DEADLINE_EXCEEDED); its batch still runs, as a request already queued over HTTP does when its
  // client hangs up.
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context, const grpc::ByteBuffer* bytes,
                                       grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (calls_.fetch_add(1) >= max_calls_) {
      calls_.fetch_sub(1);
      reactor->Finish({grpc::StatusCode::RESOURCE_EXHAUSTED, std::to_string(max_calls_) +
                                                                  " inference calls are in flight, this server's "
                                                                  "bound; retry later"});
      return reactor;
    }
    const auto start = std::chrono::steady_clock::now();
    std::shared_ptr<const ServedModel> held;  // alive while `counted` is used (an unload may race)
    const ServedVersion* counted = nullptr;   // the version whose statistics count the call
    const grpc::Status refused = grpc_guarded([&] {
      authorize(*context);
      inference::ModelInferRequest request;
      grpc::ByteBuffer copy(*bytes);  // Deserialize consumes its buffer; the copy shares the slices
      const grpc::Status parsed_message =
          grpc::SerializationTraits<inference::ModelInferRequest>::Deserialize(&copy, &request);
      if (!parsed_message.ok())
        throw HttpError(400, "the message is not a ModelInferRequest: protobuf cannot parse its " +
                                 std::to_string(bytes->Length()) + " bytes");
      const Target t = find_target(state_, request.model_name(), request.model_version());
      held = t.model;
      counted = t.version;
      const auto& config = *t.model->config;  // (ModelConfig names the call here)
      InferRequest parsed = parse_grpc_infer_request(request, config);
      Tensors inputs = std::move(parsed.inputs);
      t.version->batcher->submit(std::move(inputs), [this, reactor, response, start, t, &config,
                                                     parsed = std::move(parsed)](std::future<Tensors> outputs) {
        const grpc::Status status = grpc_guarded([&] {
          inference::ModelInferResponse message;
          write_grpc_infer_response(parsed, config, t.version->version, outputs.get(), message);
          bool own = false;
          const grpc::Status written =
              grpc::SerializationTraits<inference::ModelInferResponse>::Serialize(message, response, &own);
          if (!written.ok()) throw std::runtime_error("the response could not be written: " + written.error_message());
        });
        finish(reactor, status, t.version, start);
      });
    });
    if (!refused.ok()) finish(reactor, refused, counted, start);
    return reactor;
  }

  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* context,
                                            const inference::ModelStatisticsRequest* request,
                                            inference::ModelStatisticsResponse* response) override {
    return answered(context, [&] {
      authorize(*context);
      if (request->name().empty()) {
        for (const auto& m : state_.repository.models())
          for (const ServedVersion& v : m->versions)
            write_statistics(m->name, std::to_string(v.version), v.statistics->snapshot(),
                             *response->add_model_stats());
        return;
      }
      const Target t = find_target(state_, request->name(), request->version());
      for (const ServedVersion& v : t.model->versions)
        if (request->version().empty() || &v == t.version)
          write_statistics(t.model->name, std::to_string(v.version), v.statistics->snapshot(),
                           *response->add_model_stats());
    });
  }

  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* context,
                                            const inference::RepositoryIndexRequest* request,
                                            inference::RepositoryIndexResponse* response) override {
    return answered(context, [&] {
      authorize(*context);
      for (const IndexEntry& e : repository_index(state_)) {
        if (request->ready() && e.state != "READY") continue;
        auto* m = response->add_models();
        m->set_name(e.name);
        m->set_version(e.version);
        m->set_state(e.state);
        m->set_reason(e.reason);
      }
    });
  }

  // Triton's model repository extension, as over HTTP: a load's "config" override is read,
  // "unload_dependents" changes nothing without ensembles, "file:" overrides are refused.
  grpc::ServerUnaryReactor* RepositoryModelLoad(grpc::CallbackServerContext* context,
                                                const inference::RepositoryModelLoadRequest* request,
                                                inference::RepositoryModelLoadResponse*) override {
    return answered(context, [&] {
      authorize(*context);
      std::optional<std::string> config;
      for (const auto& [key, value] : request->parameters()) {
        if (key == "config" && value.has_string_param()) {
          config = value.string_param();
        } else if (key == "config") {
          throw HttpError(400, "parameter 'config' is the model configuration as JSON in string_param");
        } else if (key != "unload_dependents") {
          refuse_control_parameter(key);
        }
      }
      control_model(state_, request->model_name(), /*load=*/true, config);
    });
  }

  grpc::ServerUnaryReactor* RepositoryModelUnload(grpc::CallbackServerContext* context,
                                                  const inference::RepositoryModelUnloadRequest* request,
                                                  inference::RepositoryModelUnloadResponse*) override {
    return answered(context, [&] {
      authorize(*context);
      control_model(state_, request->model_name(), /*load=*/false);
    });
  }

 private:
  void authorize(const grpc::CallbackServerContext& context) const {
    const auto& metadata = context.client_metadata();
    const auto it = metadata.find("authorization");
    const std::string given = it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
    check_bearer(state_.auth_token, it == metadata.end() ? nullptr : &given);
  }

  // Ends an inference call: its statistics (a success or a failure, from `start`) when it reached
  // a version, then its status.
  void finish(grpc::ServerUnaryReactor* reactor, const grpc::Status& status, const ServedVersion* version,
              std::chrono::steady_clock::time_point start) {
    if (version != nullptr) {
      const int64_t ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
      status.ok() ? version->statistics->record_success(ns) : version->statistics->record_failure(ns);
    }
    calls_.fetch_sub(1);
    reactor->Finish(status);
  }

  ServiceState& state_;
  const int64_t max_calls_;
  std::atomic<int64_t> calls_{0};
};

// "127.0.0.1:8001", "[::1]:8001"
std::string grpc_endpoint(const std::string& address, int port) {
  const bool ipv6 = address.find(':') != std::string::npos;
  return (ipv6 ? "[" + address + "]" : address) + ":" + std::to_string(port);
}

}  // namespace

struct GrpcServer::Impl {
  Impl(ServiceState& state, GrpcServerOptions o)
      : service(std::make_unique<GrpcInferenceService>(state, o.max_calls)), options(std::move(o)) {}
  std::unique_ptr<grpc::Service> service;
  GrpcServerOptions options;
  std::unique_ptr<grpc::Server> server;
  std::mutex mutex;
  std::condition_variable stop_cv;
  bool stopping = false;
  double drain_timeout_s = 0;
};

GrpcServer::GrpcServer(ServiceState& state, GrpcServerOptions options)
    : impl_(std::make_unique<Impl>(state, std::move(options))) {
  const GrpcServerOptions& o = impl_->options;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(grpc_endpoint(o.address, o.port), grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(impl_->service.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<size_t>(o.max_message_bytes, INT32_MAX)));
  builder.SetMaxSendMessageSize(-1);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, o.max_streams_per_connection);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, static_cast<int>(o.idle_timeout_s * 1000));
  impl_->server = builder.BuildAndStart();
  TORCH_CHECK(impl_->server != nullptr && port_ != 0, "cannot listen for gRPC on ", grpc_endpoint(o.address, o.port));
}

GrpcServer::~GrpcServer() = default;

bool GrpcServer::loopback_only() const {
  const std::string& a = impl_->options.address;
  in_addr v4{};
  in6_addr v6{};
  if (inet_pton(AF_INET, a.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  if (inet_pton(AF_INET6, a.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return a == "localhost";
}

void GrpcServer::serve() {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  impl_->stop_cv.wait(lock, [this] { return impl_->stopping; });
  const auto limit = std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(
                         std::chrono::duration<double>(impl_->drain_timeout_s));
  lock.unlock();
  impl_->server->Shutdown(limit);  // refuses new calls; those running finish or are cancelled at `limit`
  impl_->server->Wait();
}

void GrpcServer::stop(double drain_timeout_s) {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
    impl_->drain_timeout_s = drain_timeout_s;
  }
  impl_->stop_cv.notify_all();
}

}  // namespace lockstep::serve
