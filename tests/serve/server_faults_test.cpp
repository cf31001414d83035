// `lockstep serve` under bad input and faults: every malformed request gets its 4xx and a message
// and the next request is served; SIGTERM or SIGHUP during load lets the requests in flight finish
// and exits 0; a port already served is refused; a model that fails to load is not ready while the
// others serve.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>

#include "serve_process.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using testing::curl;

class ServeFaultsTest : public testing::ConvnetWeightsTest {
 protected:
  std::string write(const std::string& name, const std::string& content) {
    const std::string path = scratch_ / name;
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  std::string good_body() { return write("good.json", testing::json_infer_body(torch::zeros({1, 1, 28, 28}))); }
  testing::TempDir scratch_;
};

TEST_F(ServeFaultsTest, EveryBadRequestGetsItsStatusAndMessageAndTheServerAnswersTheNext) {
  testing::ServeProcess server({"--model", "convnet", "--weights", weights(), "--threads", "1",
                                "--http-max-input-size", "100000"},
                               scratch_ / "log");
  ASSERT_TRUE(server.wait_ready()) << server.log();
  const std::string infer = server.url("/v2/models/convnet/infer");
  std::string values;
  for (int i = 0; i < 784; ++i) values += (i ? ",0.5" : "0.5");
  auto input = [&](const std::string& shape, const std::string& datatype, const std::string& data) {
    return R"({"inputs":[{"name":"input","shape":)" + shape + R"(,"datatype":")" + datatype + R"(","data":[)" + data +
           "]}]}";
  };
  const std::string binary_header =
      R"({"inputs":[{"name":"input","shape":[1,1,28,28],"datatype":"FP32","parameters":{"binary_data_size":100}}]})";
  const std::string short_header =
      R"({"inputs":[{"name":"input","shape":[1,1,28,28],"datatype":"FP32","parameters":{"binary_data_size":3136}}]})";
  struct Case {
    std::string what, curl_args;
    int status;
    std::string message;
  };
  const std::vector<Case> cases{
      {"malformed JSON", "--data-binary @" + write("a", R"({"inputs": [)") + " " + infer, 400,
       "malformed JSON in the request body"},
      {"wrong shape", "--data-binary @" + write("b", input("[1,1,28,27]", "FP32", values)) + " " + infer, 400,
       "input 'input' has shape [1, 1, 28, 27]; model 'convnet' takes [-1, 1, 28, 28] with at most 64 samples"},
      {"wrong datatype", "--data-binary @" + write("c", input("[1,1,28,28]", "INT64", values)) + " " + infer, 400,
       "input 'input' has datatype \"INT64\"; model 'convnet' takes FP32"},
      {"too few values", "--data-binary @" + write("d", input("[1,1,28,28]", "FP32", "1,2,3")) + " " + infer, 400,
       "input 'input' has 3 values; shape [1, 1, 28, 28] needs 784"},
      {"binary size that does not match the shape",
       "-H 'Inference-Header-Content-Length: " + std::to_string(binary_header.size()) + "' --data-binary @" +
           write("e", binary_header + std::string(100, '\0')) + " " + infer,
       400, "binary_data_size 100 does not match shape [1, 1, 28, 28] of FP32, which is 3136 bytes"},
      {"binary data shorter than declared",
       "-H 'Inference-Header-Content-Length: " + std::to_string(short_header.size()) + "' --data-binary @" +
           write("f", short_header + std::string(1000, '\0')) + " " + infer,
       400, "the body holds 1000 bytes after the JSON header, but the inputs' binary_data_size add up to 3136"},
      {"body over --http-max-input-size", "--data-binary @" + write("g", std::string(200000, ' ')) + " " + infer, 413,
       "over the size limit"},
      {"unknown model", "--data-binary @" + good_body() + " " + server.url("/v2/models/resnet/infer"), 404,
       "unknown model 'resnet'; this server has 'convnet'"},
      {"unknown version", "--data-binary @" + good_body() + " " + server.url("/v2/models/convnet/versions/7/infer"),
       404, "model 'convnet' has no version '7'; it serves version(s) 1"},
      {"unknown path", server.url("/v2/modelz"), 404, "no endpoint GET /v2/modelz"},
  };
  for (const Case& c : cases) {
    const auto reply = curl("-X " + std::string(c.curl_args.find("--data") != std::string::npos ? "POST " : "GET ") +
                            c.curl_args);
    EXPECT_EQ(reply.status, c.status) << c.what << ": " << reply.body;
    EXPECT_THAT(reply.json().value("error", std::string()), HasSubstr(c.message)) << c.what << ": " << reply.body;
    std::cout << c.what << ": " << reply.status << " " << reply.body << "\n";
    const auto next = curl("-X POST --data-binary @" + good_body() + " " + infer);
    EXPECT_EQ(next.status, 200) << "after " << c.what << ": " << next.body;
  }
  EXPECT_TRUE(testing::process_alive(server.child().pid()));
  const auto stats = curl(server.url("/v2/models/convnet/stats")).json()["model_stats"][0]["inference_stats"];
  EXPECT_EQ(stats["success"]["count"], cases.size());
  EXPECT_EQ(stats["fail"]["count"], 6);  // the six 400s on the model's own endpoint
}

// SIGTERM, and SIGHUP (a terminal or ssh session gone) the same way.
class ServeShutdownSignal : public ServeFaultsTest, public ::testing::WithParamInterface<int> {};

TEST_P(ServeShutdownSignal, DuringLoadFinishesTheRequestsInFlightAndExitsZero) {
  const int sig = GetParam();
  const std::string name = sig == SIGTERM ? "SIGTERM" : "SIGHUP";
  // Requests wait up to 3 s in the queue for a batch of 64 that never fills, so they are surely in
  // flight when the signal arrives.
  testing::ServeProcess server({"--model", "convnet", "--weights", weights(), "--threads", "1",
                                "--max-queue-delay-us", "3000000", "--exit-timeout", "20"},
                               scratch_ / "log");
  ASSERT_TRUE(server.wait_ready()) << server.log();
  constexpr int kInFlight = 6;
  const std::string request = "-X POST --data-binary @" + good_body() + " " + server.url("/v2/models/convnet/infer");
  std::vector<std::future<testing::HttpReply>> clients;  // a future of std::async waits when destroyed
  for (int i = 0; i < kInFlight; ++i) clients.push_back(std::async(std::launch::async, [&] { return curl(request); }));
  ASSERT_TRUE(testing::wait_until(
      [&] { return testing::metric_value(curl(server.metrics_url()).body, "nv_inference_pending_request_count") == kInFlight; },
      std::chrono::seconds(30)));
  const auto signalled = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(server.child().pid(), sig), 0);
  std::vector<testing::HttpReply> replies;
  for (auto& c : clients) replies.push_back(c.get());
  const auto exit_code = server.child().wait_for(std::chrono::seconds(20));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  for (const auto& r : replies) {
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json()["outputs"][0]["shape"], nlohmann::json({1, 10})) << r.body;
  }
  ASSERT_TRUE(exit_code.has_value()) << "still running 20 s after " << name << "\n" << server.log();
  EXPECT_EQ(*exit_code, 0) << server.log();
  EXPECT_LT(seconds, 20.0);
  EXPECT_THAT(server.log(), HasSubstr("lockstep serve: " + name));
  EXPECT_THAT(server.log(), HasSubstr("lockstep serve: stopped"));
  EXPECT_EQ(curl(server.url("/v2/health/live")).status, 0);  // nobody listens any more
}

INSTANTIATE_TEST_SUITE_P(Signals, ServeShutdownSignal, ::testing::Values(SIGTERM, SIGHUP),
                         [](const auto& info) { return info.param == SIGTERM ? "sigterm" : "sighup"; });

// A port one server listens on is refused to a second one, and one server cannot take the same port
// twice, instead of the kernel splitting the requests between the two.
TEST_F(ServeFaultsTest, APortAlreadyServedIsRefusedNamingWhichPort) {
  testing::ServeProcess first({"--model", "convnet", "--weights", weights(), "--threads", "1"}, scratch_ / "log");
  ASSERT_TRUE(first.wait_ready()) << first.log();
  const std::string serve = std::string(LOCKSTEP_CLI) + " serve --model convnet --weights " + weights() +
                            " --threads 1 --http-address 127.0.0.1 --grpc-port 0 ";
  const auto second = testing::run_command("timeout 30 " + serve + "--http-port " + std::to_string(first.port()) +
                                           " --metrics-port 0");
  EXPECT_EQ(second.exit_code, 1) << second.output;  // not 124: it did not serve on
  EXPECT_THAT(second.output, HasSubstr("cannot listen on 127.0.0.1:" + std::to_string(first.port()) +
                                       ": Address already in use (the HTTP port)"));
  const int port = testing::free_port_pair();
  const auto same = testing::run_command("timeout 30 " + serve + "--http-port " + std::to_string(port) +
                                         " --metrics-port " + std::to_string(port));
  EXPECT_EQ(same.exit_code, 2) << same.output;
  EXPECT_THAT(same.output, HasSubstr("--http-port and --metrics-port are both " + std::to_string(port)));
  EXPECT_EQ(curl(first.url("/v2/health/ready")).status, 200);  // the first one serves on
}

// The size limit holds for chunked bodies too, on every route (httplib read a chunked body whole,
// whatever its size): reading stops at the limit with a 413; the server's memory does not grow
// with what the client sends.
TEST_F(ServeFaultsTest, AChunkedBodyOverTheLimitIsRefusedWithoutBeingRead) {
  testing::ServeProcess server({"--model", "convnet", "--weights", weights(), "--threads", "1",
                                "--http-max-input-size", "1000"}, scratch_ / "log");
  ASSERT_TRUE(server.wait_ready()) << server.log();
  const auto rss_mib = [&] {
    std::ifstream status("/proc/" + std::to_string(server.child().pid()) + "/status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
    return -1.0;
  };
  const double before = rss_mib();
  const auto chunked = [&](const std::string& source, const std::string& path) {
    return testing::run_command(source + " | curl -sS --max-time 60 -o /dev/null -w '%{http_code}' -X POST "
                                "-H 'Transfer-Encoding: chunked' -T - " + server.url(path)).output;
  };
  // A valid request over the limit (a 28 x 28 image as JSON is ~4 kB): 200 before the fix.
  EXPECT_EQ(chunked("cat " + good_body(), "/v2/models/convnet/infer"), "413");
  EXPECT_THAT(chunked("head -c 200000000 /dev/zero", "/v2/models/convnet/infer"), ::testing::EndsWith("413"));
  EXPECT_THAT(chunked("head -c 200000000 /dev/zero", "/v2/repository/index"), ::testing::EndsWith("413"));
  const double after = rss_mib();
  std::cout << "[ measured ] server RSS " << before << " MiB before 2 x 200 MB chunked bodies, " << after << " after\n";
  EXPECT_LT(after - before, 50.0);
  EXPECT_EQ(curl(server.url("/v2/health/live")).status, 200);
  const auto small = curl("-X POST -H 'Transfer-Encoding: chunked' --data-binary '{}' " + server.url("/v2/repository/index"));
  EXPECT_EQ(small.status, 200) << small.body;  // a chunked body under the limit is read on any route
}

// A request a proxy in front could frame differently from this server (two Content-Lengths, or one
// beside chunked encoding) is refused with 400 and the connection closed, never answered as the
// first Content-Length says.
TEST_F(ServeFaultsTest, ConflictingFramingIsRefused) {
  testing::ServeProcess server({"--model", "convnet", "--weights", weights(), "--threads", "1"}, scratch_ / "log");
  ASSERT_TRUE(server.wait_ready()) << server.log();
  // Raw bytes through bash's /dev/tcp: curl would not send these headers as written. The reply comes
  // at once, then the server's end of the connection closes, which ends `cat` (cut at 10 s if not).
  const auto raw = [&](const std::string& headers, const std::string& body) {
    return testing::run_command("bash -c 'exec 3<>/dev/tcp/127.0.0.1/" + std::to_string(server.port()) +
                                "; printf \"POST /v2/repository/index HTTP/1.1\\r\\nHost: x\\r\\n" + headers +
                                "\\r\\n" + body + "\" >&3; timeout 10 cat <&3'").output;
  };
  const std::string two_lengths = raw("Content-Length: 2\\r\\nContent-Length: 40\\r\\n", "{}");
  EXPECT_THAT(two_lengths, HasSubstr("HTTP/1.1 400"));
  EXPECT_THAT(two_lengths, HasSubstr("Content-Length headers that differ"));
  const std::string both = raw("Content-Length: 2\\r\\nTransfer-Encoding: chunked\\r\\n", "2\\r\\n{}\\r\\n0\\r\\n\\r\\n");
  EXPECT_THAT(both, HasSubstr("HTTP/1.1 400"));
  EXPECT_THAT(both, HasSubstr("both a Content-Length and chunked encoding"));
  const std::string same = raw("Content-Length: 2\\r\\nContent-Length: 2\\r\\nConnection: close\\r\\n", "{}");
  EXPECT_THAT(same, HasSubstr("HTTP/1.1 200"));  // repeated but equal: one length, as RFC 9110 allows
  EXPECT_EQ(curl(server.url("/v2/health/live")).status, 200);
}

TEST_F(ServeFaultsTest, ExitTimeoutEndsTheServerWhenRequestsDoNotFinishInTime) {
  testing::ServeProcess server({"--model", "convnet", "--weights", weights(), "--threads", "1",
                                "--max-queue-delay-us", "30000000", "--exit-timeout", "0.5"},
                               scratch_ / "log");
  ASSERT_TRUE(server.wait_ready()) << server.log();
  const std::string request = "-X POST --data-binary @" + good_body() + " " + server.url("/v2/models/convnet/infer");
  auto client = std::async(std::launch::async, [&] { return curl(request); });
  ASSERT_TRUE(testing::wait_until(
      [&] { return testing::metric_value(curl(server.metrics_url()).body, "nv_inference_pending_request_count") == 1; },
      std::chrono::seconds(30)));
  ASSERT_EQ(::kill(server.child().pid(), SIGTERM), 0);
  const auto exit_code = server.child().wait_for(std::chrono::seconds(10));  // not the 30 s delay
  const testing::HttpReply reply = client.get();
  ASSERT_TRUE(exit_code.has_value());
  EXPECT_EQ(*exit_code, 1);
  EXPECT_THAT(server.log(), HasSubstr("requests still in flight after the exit timeout of 0.5 s"));
  EXPECT_NE(reply.status, 200);
}

TEST_F(ServeFaultsTest, ModelThatFailsToLoadIsNotReadyWhileTheOthersServe) {
  testing::TempDir repo;
  testing::write_repository_model(repo.path(), "convnet", testing::convnet_config(8, 0), weights());
  testing::write_repository_model(repo.path(), "broken", testing::convnet_config(8, 0), "");
  std::ofstream(repo / "broken/1/model.pt") << "not a weights file";
  testing::write_repository_model(repo.path(), "misspelt",
                                  "backend: \"lockstep\"\nmax_batch_size: 8\ndynamic_batching { max_queue_delay: 5 }\n", "");
  testing::ServeProcess server({"--model-repository", repo.path(), "--threads", "1"}, scratch_ / "log");
  ASSERT_TRUE(server.wait_ready("/v2/models/convnet/ready")) << server.log();

  const auto broken = curl(server.url("/v2/models/broken/ready"));
  EXPECT_EQ(broken.status, 503);
  EXPECT_THAT(broken.json()["error"].get<std::string>(), HasSubstr("model 'broken' is not ready"));
  EXPECT_THAT(broken.json()["error"].get<std::string>(), HasSubstr("broken/1/model.pt"));
  const auto misspelt = curl(server.url("/v2/models/misspelt/ready"));
  EXPECT_EQ(misspelt.status, 503);
  EXPECT_THAT(misspelt.json()["error"].get<std::string>(), HasSubstr("misspelt/config.pbtxt:3:"));
  EXPECT_THAT(misspelt.json()["error"].get<std::string>(), HasSubstr("max_queue_delay"));
  EXPECT_EQ(curl(server.url("/v2/health/ready")).status, 503);  // strict readiness, as Triton's default
  EXPECT_EQ(curl("-X POST --data-binary @" + good_body() + " " + server.url("/v2/models/broken/infer")).status, 503);
  EXPECT_EQ(curl("-X POST --data-binary @" + good_body() + " " + server.url("/v2/models/convnet/infer")).status, 200);
  const auto index = curl("-X POST -d '' " + server.url("/v2/repository/index")).json();
  ASSERT_EQ(index.size(), 3u) << index;
  EXPECT_EQ(index[0]["name"], "broken");
  EXPECT_EQ(index[0]["state"], "UNAVAILABLE");
  EXPECT_EQ(index[1]["state"], "READY");
  EXPECT_THAT(server.log(), HasSubstr("model 'misspelt' UNAVAILABLE"));
}

// One bad version does not take the model's good ones with it (Triton serves the versions that load).
TEST_F(ServeFaultsTest, AVersionThatFailsToLoadIsUnavailableWhileTheOthersServe) {
  testing::TempDir repo;
  testing::write_repository_model(repo.path(), "convnet",
                                  testing::convnet_config(8, 0) + "version_policy { all { } }\n", weights());
  std::filesystem::create_directories(repo / "convnet/2");
  std::ofstream(repo / "convnet/2/model.pt") << "not a weights file";
  testing::ServeProcess server({"--model-repository", repo.path(), "--threads", "1"}, scratch_ / "log");
  ASSERT_TRUE(server.wait_ready()) << server.log();  // every model is ready: strict readiness holds
  EXPECT_EQ(curl(server.url("/v2/models/convnet/versions/1/ready")).status, 200);
  const auto bad = curl(server.url("/v2/models/convnet/versions/2/ready"));
  EXPECT_EQ(bad.status, 503);
  EXPECT_THAT(bad.json()["error"].get<std::string>(), HasSubstr("model 'convnet' version 2 is not ready"));
  EXPECT_THAT(bad.json()["error"].get<std::string>(), HasSubstr("convnet/2/model.pt"));
  const auto infer = curl("-X POST --data-binary @" + good_body() + " " + server.url("/v2/models/convnet/infer"));
  EXPECT_EQ(infer.status, 200) << infer.body;
  EXPECT_EQ(infer.json()["model_version"], "1");  // the highest version that loaded
  const auto index = curl("-X POST " + server.url("/v2/repository/index")).json();
  ASSERT_EQ(index.size(), 2u) << index;
  EXPECT_EQ(index[0]["state"], "READY");
  EXPECT_EQ(index[1]["version"], "2");
  EXPECT_EQ(index[1]["state"], "UNAVAILABLE");
  EXPECT_THAT(server.log(), HasSubstr("model 'convnet' version 2 UNAVAILABLE"));
}

}  // namespace
}  // namespace lockstep
