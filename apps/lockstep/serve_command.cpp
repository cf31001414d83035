// `lockstep serve`: trained reference models over HTTP and gRPC with the KServe v2 / Triton protocol and
// dynamic batching, from a Triton-style model repository or from one weights file.
#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <sys/stat.h>

#include <fstream>
#include <iostream>
#include <memory>

#include "checks.h"
#include "commands.h"
#include "lockstep/models/zoo.h"
#include "lockstep/serve/model_repository.h"
#include "lockstep/serve/server.h"

namespace lockstep::cli {

namespace {

struct ServeArgs {
  std::string model_repository;
  std::string model;
  std::string weights;
  int64_t instances = 1;
  int64_t max_batch_size = 64;
  int64_t max_queue_delay_us = 0;
  std::string http_address = "127.0.0.1";
  int http_port = 8000;
  int metrics_port = 8002;
  bool allow_metrics = true;
  bool allow_grpc = true;
  std::string grpc_address = "127.0.0.1";
  int grpc_port = 8001;
  int64_t http_thread_count = 64;
  int64_t max_connections = 1024;
  int64_t max_input_bytes = int64_t{64} << 20;
  double request_timeout = 30;
  double idle_timeout = 60;
  std::string auth_token_file;
  bool verbose_errors = false;
  double exit_timeout = 30;
  bool strict_readiness = true;
  int64_t threads = 0;
  std::string model_control_mode = "none";
  std::vector<std::string> load_models;
  double repository_poll_secs = 15;
};

void print_models(const serve::ModelRepository& repo, std::ostream& out) {
  for (const auto& model : repo.models()) {
    const serve::ServedModel& m = *model;
    if (!m.loaded) {
      out << "lockstep serve: model '" << m.name << "' not loaded (model control mode explicit)\n";
      continue;
    }
    if (!m.ready) {
      out << "lockstep serve: model '" << m.name << "' UNAVAILABLE: " << m.reason << "\n";
      continue;
    }
    for (const serve::UnavailableVersion& u : m.unavailable)
      out << "lockstep serve: model '" << m.name << "' version " << u.version << " UNAVAILABLE: " << u.reason << "\n";
    for (const serve::ServedVersion& v : m.versions)
      out << "lockstep serve: model '" << m.name << "' version " << v.version << " READY ("
          << (m.config->format == serve::ModelFormat::kTorchScript ? "TorchScript" : m.config->architecture)
          << ", " << m.config->instance_count << " instance(s) x " << repo.threads_per_instance()
          << " thread(s), max_batch_size " << m.config->max_batch_size << ", dynamic batching "
          << (m.config->dynamic_batching ? "on" : "off") << ")\n";
  }
  out << std::flush;
}

// The bearer token in `path`: its first line, without the line end. Like ssh's keys, a file others
// may read is refused.
std::string read_token(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK_VALUE(in.good(), "--auth-token-file '", path, "' cannot be read");
  struct stat info {};
  TORCH_CHECK_VALUE(::stat(path.c_str(), &info) == 0 && (info.st_mode & 0077) == 0, "--auth-token-file '", path,
                    "' may be read by others (mode ", std::oct, info.st_mode & 0777, "); chmod 600 it");
  std::string token;
  std::getline(in, token);
  if (!token.empty() && token.back() == '\r') token.pop_back();
  TORCH_CHECK_VALUE(token.size() >= 16 && token.find_first_of(" \t") == std::string::npos, "--auth-token-file '", path,
                    "': its first line must be the token, at least 16 characters without spaces (e.g. openssl rand "
                    "-hex 32); it has ", token.size());
  return token;
}

int run_serve(const ServeArgs& a) {
  TORCH_CHECK_VALUE(a.model_repository.empty() != a.model.empty(),
                    "pass either --model-repository DIR or --model NAME --weights FILE (not both)");
  TORCH_CHECK_VALUE(a.model.empty() || !a.weights.empty(), "--model ", a.model, " needs --weights FILE");
  TORCH_CHECK_VALUE(a.weights.empty() || !a.model.empty(), "--weights needs --model NAME");
  TORCH_CHECK_VALUE(!a.allow_metrics || a.http_port == 0 || a.http_port != a.metrics_port,
                    "--http-port and --metrics-port are both ", a.http_port,
                    ": give the metrics a port of their own (0: any free port)");
  TORCH_CHECK_VALUE(!a.allow_grpc || a.grpc_port == 0 || a.grpc_address != a.http_address ||
                        (a.grpc_port != a.http_port && (!a.allow_metrics || a.grpc_port != a.metrics_port)),
                    "--grpc-port ", a.grpc_port, " is also the --http-port or --metrics-port: give gRPC a port of ",
                    "its own (0: any free port)");
  serve::block_shutdown_signals();  // before any thread starts: see block_shutdown_signals
  TORCH_CHECK_VALUE(a.model_control_mode == "none" || !a.model_repository.empty(), "--model-control-mode ",
                    a.model_control_mode, " needs --model-repository DIR");
  TORCH_CHECK_VALUE(a.load_models.empty() || a.model_control_mode == "explicit",
                    "--load-model is for --model-control-mode explicit (the other modes load every model)");
  const auto mode = a.model_control_mode == "explicit" ? serve::ModelControlMode::kExplicit
                    : a.model_control_mode == "poll"   ? serve::ModelControlMode::kPoll
                                                       : serve::ModelControlMode::kNone;
  const auto repo_options = serve::RepositoryOptions()
                                .threads(a.threads)
                                .model_control_mode(mode)
                                .startup_models(a.load_models)
                                .poll_interval_s(a.repository_poll_secs)
                                .on_change([](const std::string& line) {
                                  std::cout << "lockstep serve: " << line << std::endl;
                                });
  std::unique_ptr<serve::ModelRepository> repo;
  if (a.model.empty()) {
    repo = serve::ModelRepository::load(a.model_repository, repo_options);
  } else {
    serve::ModelConfig config = serve::default_model_config(a.model, a.instances);
    TORCH_CHECK_VALUE(a.max_batch_size >= 1, "--max-batch-size ", a.max_batch_size, " must be at least 1");
    config.max_batch_size = a.max_batch_size;
    config.max_queue_delay_us = a.max_queue_delay_us;
    repo = serve::ModelRepository::single(config, a.weights, repo_options);
  }
  print_models(*repo, std::cout);
  serve::Server server(*repo, serve::ServerOptions()
                                  .auth_token(a.auth_token_file.empty() ? "" : read_token(a.auth_token_file))
                                  .verbose_errors(a.verbose_errors)
                                  .max_connections(a.max_connections)
                                  .request_timeout_s(a.request_timeout)
                                  .idle_timeout_s(a.idle_timeout)
                                  .http_address(a.http_address)
                                  .http_port(a.http_port)
                                  .metrics_port(a.metrics_port)
                                  .allow_metrics(a.allow_metrics)
                                  .allow_grpc(a.allow_grpc)
                                  .grpc_address(a.grpc_address)
                                  .grpc_port(a.grpc_port)
                                  .http_thread_count(a.http_thread_count)
                                  .max_input_bytes(a.max_input_bytes)
                                  .exit_timeout_s(a.exit_timeout)
                                  .strict_readiness(a.strict_readiness));
  return server.run(std::cout);
}

}  // namespace

Command add_serve_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "serve", "Serve trained models over HTTP and gRPC: the KServe v2 / Triton protocol, with dynamic batching");
  cmd->option_defaults()->always_capture_default();
  auto a = std::make_shared<ServeArgs>();
  const auto& models = models::model_names();
  cmd->add_option("--model-repository", a->model_repository,
                  "Triton-style repository: DIR/<name>/config.pbtxt and DIR/<name>/<version>/model.pt");
  cmd->add_option("--model", a->model, "Instead: serve this reference model (" + c10::Join(", ", models) +
                                           ") under its name, tensors 'input' and 'logits'")
      ->check(CLI::IsMember(models));
  cmd->add_option("--weights", a->weights, "--model's weights: a --save-model file, a checkpoint, or a state dict");
  cmd->add_option("--instances", a->instances, "--model: model copies running batches in parallel")
      ->check(cli::positive_count());
  cmd->add_option("--max-batch-size", a->max_batch_size, "--model: samples per forward at most")
      ->check(cli::positive_count());
  cmd->add_option("--max-queue-delay-us", a->max_queue_delay_us,
                  "--model: how long a request may wait for its batch to fill (microseconds)")
      ->check(cli::non_negative_count());
  cmd->add_option("--model-control-mode", a->model_control_mode,
                  "none: every model loads at start; explicit: --load-model ones, then clients load and unload; "
                  "poll: every model, and the repository is rescanned every --repository-poll-secs")
      ->check(CLI::IsMember({"none", "explicit", "poll"}));
  cmd->add_option("--load-model", a->load_models, "explicit mode: a model to load at start ('*': all); repeatable");
  cmd->add_option("--repository-poll-secs", a->repository_poll_secs, "poll mode: seconds between rescans")
      ->check(cli::positive_number());
  cmd->add_option("--http-address", a->http_address,
                  "Address to listen on (0.0.0.0: every interface; see --auth-token-file)");
  cmd->add_option("--http-port", a->http_port, "KServe v2 HTTP port (0: any free port, printed)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--metrics-port", a->metrics_port, "Prometheus /metrics port (0: any free port, printed)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--allow-metrics", a->allow_metrics, "Serve Prometheus metrics");
  cmd->add_option("--allow-grpc", a->allow_grpc, "Serve the KServe v2 gRPC service (inference.GRPCInferenceService)");
  cmd->add_option("--grpc-address", a->grpc_address, "Address gRPC listens on (0.0.0.0: every interface)");
  cmd->add_option("--grpc-port", a->grpc_port, "KServe v2 gRPC port (0: any free port, printed)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--http-thread-count", a->http_thread_count,
                  "Requests handled at once (idle and slow connections hold no thread)")
      ->check(cli::positive_count());
  cmd->add_option("--http-max-connections", a->max_connections, "Connections open at once (past it: 503)")
      ->check(cli::positive_count());
  cmd->add_option("--http-request-timeout", a->request_timeout,
                  "Seconds from a request's first byte to its last (then 408)")
      ->check(cli::positive_number());
  cmd->add_option("--http-idle-timeout", a->idle_timeout, "Seconds a keep-alive connection may wait for a request")
      ->check(cli::positive_number());
  cmd->add_option("--auth-token-file", a->auth_token_file,
                  "File whose first line is a bearer token every endpoint but the health probes requires");
  cmd->add_flag("--verbose-errors", a->verbose_errors, "Name files by their whole path in error responses");
  cmd->add_option("--http-max-input-size", a->max_input_bytes, "Largest request body in bytes (above: 413)")
      ->check(cli::positive_count());
  cmd->add_option("--exit-timeout", a->exit_timeout,
                  "Seconds the requests in flight get to finish after SIGTERM before the server exits with 1")
      ->check(cli::non_negative_number());
  cmd->add_option("--strict-readiness", a->strict_readiness, "/v2/health/ready only when every model is ready");
  cmd->add_option("--threads", a->threads, "Intra-op threads in all, split among the model instances (0: the cores)")
      ->check(cli::non_negative_count());
  return {cmd, [a] { return run_serve(*a); }};
}

}  // namespace lockstep::cli
