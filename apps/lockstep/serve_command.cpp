// `lockstep serve`: trained reference models over HTTP with the KServe v2 / Triton protocol and
// dynamic batching, from a Triton-style model repository or from one weights file.
#include <c10/util/StringUtil.h>
#include <torch/torch.h>

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
  std::string http_address = "0.0.0.0";
  int http_port = 8000;
  int metrics_port = 8002;
  bool allow_metrics = true;
  int64_t http_thread_count = 64;
  int64_t max_input_bytes = int64_t{64} << 20;
  double exit_timeout = 30;
  bool strict_readiness = true;
  int64_t threads = 0;
};

void print_models(const serve::ModelRepository& repo, std::ostream& out) {
  for (const serve::ServedModel& m : repo.models()) {
    if (!m.ready) {
      out << "lockstep serve: model '" << m.name << "' UNAVAILABLE: " << m.reason << "\n";
      continue;
    }
    for (const serve::ServedVersion& v : m.versions)
      out << "lockstep serve: model '" << m.name << "' version " << v.version << " READY (" << m.config->architecture
          << ", " << m.config->instance_count << " instance(s) x " << repo.threads_per_instance()
          << " thread(s), max_batch_size " << m.config->max_batch_size << ", dynamic batching "
          << (m.config->dynamic_batching ? "on" : "off") << ")\n";
  }
  out << std::flush;
}

int run_serve(const ServeArgs& a) {
  TORCH_CHECK_VALUE(a.model_repository.empty() != a.model.empty(),
                    "pass either --model-repository DIR or --model NAME --weights FILE (not both)");
  TORCH_CHECK_VALUE(a.model.empty() || !a.weights.empty(), "--model ", a.model, " needs --weights FILE");
  TORCH_CHECK_VALUE(a.weights.empty() || !a.model.empty(), "--weights needs --model NAME");
  serve::block_shutdown_signals();  // before any thread starts: see block_shutdown_signals
  const auto repo_options = serve::RepositoryOptions().threads(a.threads);
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
                                  .http_address(a.http_address)
                                  .http_port(a.http_port)
                                  .metrics_port(a.metrics_port)
                                  .allow_metrics(a.allow_metrics)
                                  .http_thread_count(a.http_thread_count)
                                  .max_input_bytes(a.max_input_bytes)
                                  .exit_timeout_s(a.exit_timeout)
                                  .strict_readiness(a.strict_readiness));
  return server.run(std::cout);
}

}  // namespace

Command add_serve_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "serve", "Serve trained models over HTTP: the KServe v2 / Triton protocol, with dynamic batching");
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
  cmd->add_option("--http-address", a->http_address, "Address to listen on");
  cmd->add_option("--http-port", a->http_port, "KServe v2 HTTP port (0: any free port, printed)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--metrics-port", a->metrics_port, "Prometheus /metrics port (0: any free port, printed)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--allow-metrics", a->allow_metrics, "Serve Prometheus metrics");
  cmd->add_option("--http-thread-count", a->http_thread_count,
                  "HTTP connections served at once (each open keep-alive connection holds one)")
      ->check(cli::positive_count());
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
