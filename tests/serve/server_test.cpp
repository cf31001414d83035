// `lockstep serve` as a client meets it: the real binary on a free port, driven by curl and by
// Node's fetch. The logits it returns are the ones `lockstep predict`'s code path computes for the
// same inputs, and concurrent requests are merged into fewer forwards.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <sstream>
#include <tuple>

#include "lockstep/data/dataset.h"
#include "lockstep/export/weights_file.h"
#include "lockstep/infer/predictor.h"
#include "lockstep/serve/model_config.h"
#include "lockstep/serve/model_repository.h"
#include "lockstep/serve/server.h"
#include "serve_process.h"

namespace lockstep {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using testing::curl;

const std::string kCli = LOCKSTEP_CLI;
// Logits of the same rows may differ in the last bits between batch sizes (oneDNN picks kernels by
// shape); 1e-4 absolute on logits of magnitude ~1-10 is far below any difference in class.
constexpr double kLogitTolerance = 1e-4;

class ServeTest : public testing::ConvnetWeightsTest {
 protected:
  // Synthetic images normalised as `lockstep predict --data synthetic --images FILE` normalises a
  // file of raw pixels.
  static data::Dataset images(int64_t n) {
    data::Dataset ds = data::make_synthetic(data::SyntheticOptions().size(n).seed(3));
    const data::Dataset reference = data::make_synthetic(data::SyntheticOptions().size(1));
    ds.mean = reference.mean;
    ds.stddev = reference.stddev;
    return ds;
  }
  static torch::Tensor inputs(const data::Dataset& ds) { return ds.batch(torch::arange(ds.size())).first; }
  // What `lockstep predict` computes: the same weights loader and infer::Predictor.
  static torch::Tensor expected_logits(const torch::Tensor& input) {
    auto model = models::make_model("convnet");
    exporting::load_weights(*model, "convnet", weights());
    infer::Predictor predictor{torch::nn::AnyModule(model)};
    return predictor.forward(input);
  }
  std::string write(const std::string& name, const std::string& content) {
    const std::string path = scratch_ / name;
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  testing::TempDir scratch_;
};

TEST_F(ServeTest, CurlSessionHealthMetadataJsonAndBinaryInferMatchPredict) {
  testing::ServeProcess server({"--model", "convnet", "--weights", weights(), "--threads", "1"}, scratch_ / "log");
  ASSERT_TRUE(server.wait_ready()) << server.log();
  EXPECT_EQ(curl(server.url("/v2/health/live")).status, 200);
  const auto meta = curl(server.url("/v2")).json();
  EXPECT_EQ(meta["name"], "lockstep");
  EXPECT_THAT(meta["extensions"], Contains("binary_tensor_data"));
  EXPECT_THAT(meta["extensions"], Contains("statistics"));
  const auto model = curl(server.url("/v2/models/convnet")).json();
  EXPECT_EQ(model["versions"], nlohmann::json({"1"}));
  EXPECT_EQ(model["inputs"][0]["shape"], nlohmann::json({-1, 1, 28, 28}));
  EXPECT_EQ(model["outputs"][0], nlohmann::json({{"name", "logits"}, {"datatype", "FP32"}, {"shape", {-1, 10}}}));
  EXPECT_EQ(curl(server.url("/v2/models/convnet/versions/1/ready")).status, 200);

  const data::Dataset ds = images(6);
  const torch::Tensor input = inputs(ds);
  const torch::Tensor expected = expected_logits(input);
  const auto json_reply = curl("-X POST -H 'Content-Type: application/json' --data-binary @" +
                               write("request.json", testing::json_infer_body(input)) + " " +
                               server.url("/v2/models/convnet/infer"));
  ASSERT_EQ(json_reply.status, 200) << json_reply.body;
  const torch::Tensor json_logits = testing::json_logits(json_reply.json());
  EXPECT_TRUE(torch::allclose(json_logits, expected, 0, kLogitTolerance)) << json_logits - expected;

  // Binary both ways: the JSON header, then 6 x 784 floats; the logits come back as 6 x 10 floats.
  const std::string header = nlohmann::json{
      {"inputs", {{{"name", "input"}, {"shape", {6, 1, 28, 28}}, {"datatype", "FP32"},
                   {"parameters", {{"binary_data_size", input.numel() * 4}}}}}},
      {"outputs", {{{"name", "logits"}, {"parameters", {{"binary_data", true}}}}}}}.dump();
  const std::string body = header + std::string(static_cast<const char*>(input.data_ptr()), input.numel() * 4);
  const std::string headers = scratch_ / "headers";
  const auto binary_reply = curl("-X POST -H 'Content-Type: application/octet-stream' -H "
                                 "'Inference-Header-Content-Length: " + std::to_string(header.size()) +
                                 "' --data-binary @" + write("request.bin", body) + " -D " + headers + " " +
                                 server.url("/v2/models/convnet/versions/1/infer"));
  ASSERT_EQ(binary_reply.status, 200) << binary_reply.body;
  std::smatch length;
  const std::string header_text = testing::read_text(headers);
  ASSERT_TRUE(std::regex_search(header_text, length, std::regex(R"(Inference-Header-Content-Length: (\d+))",
                                                                 std::regex::icase))) << header_text;
  const size_t json_end = std::stoul(length[1]);
  const auto reply_header = nlohmann::json::parse(binary_reply.body.substr(0, json_end));
  ASSERT_EQ(reply_header["outputs"][0]["parameters"]["binary_data_size"], 6 * 10 * 4);
  ASSERT_EQ(binary_reply.body.size(), json_end + 240);
  torch::Tensor binary_logits = torch::empty({6, 10});
  std::memcpy(binary_logits.data_ptr(), binary_reply.body.data() + json_end, 240);
  EXPECT_TRUE(torch::equal(binary_logits, json_logits));  // the same forward's floats, bit for bit

  // `lockstep predict` on the same images, as a file of raw pixels: the same classes.
  const torch::Tensor pixels = ds.images.contiguous();
  const std::string raw = write("images.raw", std::string(static_cast<const char*>(pixels.data_ptr()), pixels.numel()));
  const auto predict = testing::run_command(kCli + " predict --model convnet --data synthetic --json --weights " +
                                            weights() + " --images " + raw);
  ASSERT_EQ(predict.exit_code, 0) << predict.output;
  const auto predictions = nlohmann::json::parse(testing::last_json_line(predict.output))["predictions"];
  const torch::Tensor served_classes = json_logits.argmax(1);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(predictions[i].get<int64_t>(), served_classes[i].item<int64_t>()) << i;
}

TEST_F(ServeTest, TritonClientGetsTheSameLogitsAsJsonAndAsBinary) {
  if (testing::run_command(std::string(LOCKSTEP_PYTHON) + " -c 'import tritonclient.http'").exit_code != 0)
    GTEST_SKIP() << "tritonclient is not installed in the venv (scripts/bootstrap --test)";
  testing::ServeProcess server({"--model", "convnet", "--weights", weights(), "--threads", "1"}, scratch_ / "log");
  ASSERT_TRUE(server.wait_ready()) << server.log();
  const torch::Tensor input = inputs(images(3));
  const torch::Tensor expected = expected_logits(input);
  const torch::Tensor flat = input.flatten();
  const std::string input_file = write(
      "input.json", nlohmann::json{{"shape", {3, 1, 28, 28}},
                                   {"data", std::vector<float>(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel())}}
                        .dump());
  const std::string client = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/serve/triton_client.py";
  for (const std::string mode : {"json", "binary"}) {
    const auto r = testing::run_command(std::string(LOCKSTEP_PYTHON) + " " + client + " " + server.url("") +
                                        " convnet " + input_file + " " + mode);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto reply = nlohmann::json::parse(testing::last_json_line(r.output));
    ASSERT_EQ(reply["status"], 200) << r.output;
    EXPECT_EQ(reply["id"], "triton-" + mode);
    EXPECT_EQ(reply["shape"], nlohmann::json({3, 10}));
    const torch::Tensor logits = torch::tensor(reply["data"].get<std::vector<float>>()).reshape({3, 10});
    EXPECT_TRUE(torch::allclose(logits, expected, 0, kLogitTolerance)) << mode << "\n" << logits - expected;
    // Binary: the logits came back as 120 raw bytes after the JSON header, not as JSON numbers.
    EXPECT_EQ(reply["binary_data_size"], mode == "binary" ? 120 : 0) << r.output;
  }
}

TEST_F(ServeTest, ConcurrentRequestsAreMergedIntoFewerForwards) {
  testing::TempDir repo;
  // Up to 16 samples per forward; a lone request waits up to 200 ms for company.
  testing::write_repository_model(repo.path(), "convnet", testing::convnet_config(16, 200000), weights());
  testing::ServeProcess server({"--model-repository", repo.path(), "--threads", "1"}, scratch_ / "log");
  ASSERT_TRUE(server.wait_ready()) << server.log();

  constexpr int kRequests = 24;
  const torch::Tensor input = inputs(images(kRequests));
  const torch::Tensor expected = expected_logits(input);
  std::vector<std::future<testing::HttpReply>> clients;  // a future of std::async waits when destroyed
  for (int i = 0; i < kRequests; ++i) {
    const std::string body = write("r" + std::to_string(i), testing::json_infer_body(input.narrow(0, i, 1)));
    // No Content-Type: curl sends its default, application/x-www-form-urlencoded, as users' scripts do.
    const std::string request = "-X POST --data-binary @" + body + " " + server.url("/v2/models/convnet/infer");
    clients.push_back(std::async(std::launch::async, [request] { return curl(request); }));
  }
  std::vector<testing::HttpReply> replies;
  for (auto& c : clients) replies.push_back(c.get());
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(replies[i].status, 200) << replies[i].body;
    const torch::Tensor logits = testing::json_logits(replies[i].json());
    EXPECT_TRUE(torch::allclose(logits, expected.narrow(0, i, 1), 0, kLogitTolerance)) << i;  // its own row
  }

  const auto stats = curl(server.url("/v2/models/convnet/stats")).json()["model_stats"][0];
  std::cout << "statistics after " << kRequests << " concurrent requests:\n" << stats.dump(1) << "\n";
  EXPECT_EQ(stats["inference_count"], kRequests);
  EXPECT_LT(stats["execution_count"].get<int64_t>(), kRequests);
  EXPECT_EQ(stats["inference_stats"]["success"]["count"], kRequests);
  EXPECT_EQ(stats["inference_stats"]["queue"]["count"], kRequests);
  int64_t samples = 0, batches = 0;
  for (const auto& b : stats["batch_stats"]) {
    EXPECT_LE(b["batch_size"].get<int64_t>(), 16);
    samples += b["batch_size"].get<int64_t>() * b["compute_infer"]["count"].get<int64_t>();
    batches += b["compute_infer"]["count"].get<int64_t>();
  }
  EXPECT_EQ(samples, kRequests);
  EXPECT_EQ(batches, stats["execution_count"]);
  const std::string metrics = curl(server.metrics_url()).body;
  EXPECT_EQ(testing::metric_value(metrics, "nv_inference_count"), kRequests);
  EXPECT_EQ(testing::metric_value(metrics, "nv_inference_exec_count"), stats["execution_count"]);
  EXPECT_EQ(testing::metric_value(metrics, "nv_inference_request_success"), kRequests);
  EXPECT_THAT(metrics, HasSubstr("# TYPE lockstep_batch_size histogram"));
}

// The library's own checks name its options, not `lockstep serve`'s flags: a program that builds a
// serve::Server never passed a flag (the CLI checks its flags itself first).
TEST_F(ServeTest, LibraryErrorsNameTheOptionsNotTheCliFlags) {
  const auto repo = serve::ModelRepository::single(serve::default_model_config("convnet"), weights(),
                                                   serve::RepositoryOptions().threads(1));
  const auto refused = [&](const serve::ServerOptions& o) {
    return testing::error_message([&] { serve::Server server(*repo, o); });
  };
  const auto base = serve::ServerOptions().http_address("127.0.0.1").http_port(0).metrics_port(0).grpc_port(0);
  const std::string missing = scratch_ / "none";
  const std::vector<std::pair<std::string, std::string>> cases{
      {refused(serve::ServerOptions(base).http_thread_count(0)),
       "ServerOptions::http_thread_count 0 must be at least 1"},
      {refused(serve::ServerOptions(base).max_input_bytes(0)), "ServerOptions::max_input_bytes 0 must be at least 1"},
      {refused(serve::ServerOptions(base).exit_timeout_s(-1)), "ServerOptions::exit_timeout_s -1 must not be negative"},
      {refused(serve::ServerOptions(base).http_port(8123).metrics_port(8123)),
       "ServerOptions::http_port and metrics_port are both 8123"},
      {testing::error_message([] { serve::default_model_config("convnet", 0); }),
       "instance_count 0: a model has between 1 and 64 instances"},
      {testing::error_message([&] { serve::ModelRepository::load(missing); }),
       "model repository '" + missing + "' is not a directory"},
  };
  for (const auto& [message, expected] : cases) {
    EXPECT_THAT(message, HasSubstr(expected));
    EXPECT_THAT(message, ::testing::Not(HasSubstr("--"))) << message;
  }
}

// Listening beyond loopback without a token lets any host that can connect infer and read the
// metadata and metrics: the server says so in the log run() writes, which `lockstep serve` prints
// (before: not a word, for the HTTP port nor the metrics port).
TEST_F(ServeTest, ListeningBeyondLoopbackWithoutATokenIsWarnedOfInTheLog) {
  const auto served = [&](const serve::ServerOptions& o) {
    const auto repo = serve::ModelRepository::single(serve::default_model_config("convnet"), weights(),
                                                     serve::RepositoryOptions().threads(1));
    serve::Server server(*repo, serve::ServerOptions(o).http_port(0).metrics_port(0).grpc_port(0));
    server.stop();  // run() then starts, writes its log and ends at once
    std::ostringstream log;
    EXPECT_EQ(server.run(log), 0);
    EXPECT_EQ(server.warnings().size(), log.str().find("warning") == std::string::npos ? 0u : 1u) << log.str();
    return std::make_tuple(server.warnings(), log.str(), server.http_port(), server.metrics_port());
  };
  const auto [warnings, log, http, metrics] = served(serve::ServerOptions().http_address("0.0.0.0"));
  ASSERT_EQ(warnings.size(), 1u) << log;
  const std::string expected = "the HTTP port " + std::to_string(http) + " and the metrics port " +
                               std::to_string(metrics) + " listen on 0.0.0.0 (beyond loopback) without an auth token";
  EXPECT_THAT(warnings[0], HasSubstr(expected));
  EXPECT_THAT(warnings[0], ::testing::Not(HasSubstr("--")));  // a library names no CLI flag
  EXPECT_THAT(log, HasSubstr("lockstep serve: warning: " + expected));
  const auto [alone, alone_log, alone_http, none] =
      served(serve::ServerOptions().http_address("0.0.0.0").allow_metrics(false));
  ASSERT_EQ(alone.size(), 1u) << alone_log;
  EXPECT_THAT(alone[0], HasSubstr("the HTTP port " + std::to_string(alone_http) + " listens on 0.0.0.0"));
  EXPECT_TRUE(std::get<0>(served(serve::ServerOptions().http_address("0.0.0.0").auth_token("0123456789abcdef"))).empty());
  for (const char* loopback : {"127.0.0.1", "127.0.0.2", "localhost"})
    EXPECT_TRUE(std::get<0>(served(serve::ServerOptions().http_address(loopback))).empty()) << loopback;
}

}  // namespace
}  // namespace lockstep
