#pragma once
// Helpers for the tests that drive a real `lockstep serve` process with curl and Node: starting it
// on free ports, waiting for it, and one HTTP request through the curl command.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "../test_util.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/zoo.h"

namespace lockstep::testing {

struct HttpReply {
  int status = 0;    // 0: curl could not connect
  std::string body;  // as received (binary safe)
  nlohmann::json json() const { return nlohmann::json::parse(body, nullptr, false); }
};

// One request through the curl command line tool: `args` are curl's (the URL, -X, -H, --data...).
inline HttpReply curl(const std::string& args) {
  const CommandResult r = run_command("curl -sS --max-time 60 -w '\\n%{http_code}' " + args);
  HttpReply reply;
  const size_t newline = r.output.rfind('\n');
  if (newline == std::string::npos) return reply;
  reply.body = r.output.substr(0, newline);
  reply.status = std::atoi(r.output.c_str() + newline + 1);
  return reply;
}

// `lockstep serve ARGS --http-port 0 --metrics-port 0 --grpc-port 0` on 127.0.0.1, started in the
// constructor; the ports are read from what it prints. Killed when the object dies, if still running.
class ServeProcess {
 public:
  ServeProcess(const std::vector<std::string>& args, const std::string& log_path) : log_path_(log_path) {
    std::vector<std::string> argv{LOCKSTEP_CLI, "serve"};
    argv.insert(argv.end(), args.begin(), args.end());
    for (const char* a : {"--http-address", "127.0.0.1", "--http-port", "0", "--metrics-port", "0", "--grpc-port", "0"})
      argv.push_back(a);
    child_ = std::make_unique<ChildProcess>(argv, log_path_);
    // The whole line, up to its end: it may be read while half written.
    const std::regex listening(R"(HTTP on http://127\.0\.0\.1:(\d+), metrics on http://127\.0\.0\.1:(\d+)/metrics)"
                               R"((?:, KServe v2 gRPC on 127\.0\.0\.1:(\d+))?\n)");
    wait_until(
        [&] {
          std::smatch m;
          const std::string text = read_text(log_path_);
          if (std::regex_search(text, m, listening)) {
            port_ = std::stoi(m[1]);
            metrics_port_ = std::stoi(m[2]);
            if (m[3].matched) grpc_port_ = std::stoi(m[3]);
            return true;
          }
          return !process_alive(child_->pid());
        },
        std::chrono::seconds(60));
  }

  int port() const { return port_; }
  int grpc_port() const { return grpc_port_; }  // 0 when the server does not serve gRPC
  std::string grpc_target() const { return "127.0.0.1:" + std::to_string(grpc_port_); }
  std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
  std::string metrics_url() const { return "http://127.0.0.1:" + std::to_string(metrics_port_) + "/metrics"; }
  std::string log() const { return read_text(log_path_); }
  ChildProcess& child() { return *child_; }

  // Polls GET `path` until it answers 200, for at most `timeout`.
  bool wait_ready(const std::string& path = "/v2/health/ready",
                  std::chrono::milliseconds timeout = std::chrono::seconds(60)) const {
    if (port_ == 0) return false;
    return wait_until([&] { return curl(url(path)).status == 200; }, timeout);
  }

 private:
  std::string log_path_;
  std::unique_ptr<ChildProcess> child_;
  int port_ = 0;
  int metrics_port_ = 0;
  int grpc_port_ = 0;
};

// A JSON infer request body for `input` (n, ...) fp32.
inline std::string json_infer_body(const torch::Tensor& input, bool binary_output = false) {
  const torch::Tensor flat = input.contiguous().flatten();
  nlohmann::json j{{"inputs",
                    {{{"name", "input"},
                      {"shape", input.sizes().vec()},
                      {"datatype", "FP32"},
                      {"data", std::vector<float>(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel())}}}}};
  if (binary_output) j["parameters"] = {{"binary_data_output", true}};
  return j.dump();
}

// The logits of a JSON infer response, as an (n, classes) tensor.
inline torch::Tensor json_logits(const nlohmann::json& response) {
  const auto& out = response.at("outputs").at(0);
  const auto data = out.at("data").get<std::vector<float>>();
  return torch::tensor(data).reshape(out.at("shape").get<std::vector<int64_t>>());
}

// A value of one metric line of Prometheus text, e.g. nv_inference_pending_request_count; -1 if absent.
inline int64_t metric_value(const std::string& text, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("\n" + name + R"(\{[^}]*\} (\d+))"))) return -1;
  return std::stoll(m[1]);
}


// A seeded convnet whose BatchNorm running statistics have moved off their defaults (a few
// training-mode forwards), saved as `lockstep train --save-model` saves it.
inline void write_convnet_weights(const std::string& path, uint64_t seed = 5) {
  torch::manual_seed(seed);
  auto model = models::make_model("convnet");
  model->train();
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 3; ++i) model->forward(torch::randn({16, 1, 28, 28}) * 2 + 0.5);
  models::save_state_dict(*model, path);
}

// A fixture whose suite shares one seeded convnet's weights (write_convnet_weights), written once.
class ConvnetWeightsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    write_convnet_weights(weights());
  }
  static void TearDownTestSuite() { dir_.reset(); }
  static std::string weights() { return *dir_ / "convnet.pt"; }

 private:
  static inline std::unique_ptr<TempDir> dir_;
};

// DIR/<name>/config.pbtxt with `config`, and DIR/<name>/1/model.pt copied from `weights` (if given).
inline void write_repository_model(const std::string& dir, const std::string& name, const std::string& config,
                                   const std::string& weights) {
  std::filesystem::create_directories(dir + "/" + name + "/1");
  std::ofstream(dir + "/" + name + "/config.pbtxt") << config;
  if (!weights.empty()) std::filesystem::copy_file(weights, dir + "/" + name + "/1/model.pt");
}

// A convnet config.pbtxt with dynamic batching.
inline std::string convnet_config(int64_t max_batch_size, int64_t max_queue_delay_us, int64_t instances = 1) {
  return "backend: \"lockstep\"\nmax_batch_size: " + std::to_string(max_batch_size) +
         "\nparameters { key: \"architecture\" value { string_value: \"convnet\" } }\n"
         "input [ { name: \"input\" data_type: TYPE_FP32 dims: [ 1, 28, 28 ] } ]\n"
         "output [ { name: \"logits\" data_type: TYPE_FP32 dims: [ 10 ] } ]\n"
         "dynamic_batching { max_queue_delay_microseconds: " + std::to_string(max_queue_delay_us) +
         " }\ninstance_group [ { count: " + std::to_string(instances) + " kind: KIND_CPU } ]\n";
}

}  // namespace lockstep::testing
