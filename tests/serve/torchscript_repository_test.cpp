// A model repository written as a Triton user writes one for the PyTorch backend (platform
// "pytorch_libtorch", <name>/config.pbtxt, <name>/1/model.pt, INPUT__0/OUTPUT__0 or forward's
// argument names), served by the real `lockstep serve` and asked over HTTP: several inputs and
// outputs of FP32, FP16, BF16, INT64, INT32 and BOOL, a model without a batch dimension
// (max_batch_size 0), dynamic batching over two instances, a subset of outputs, binary data; every
// answer equals what Python's module(x) computed. Modules that do not fit their config are named
// with what was expected.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <thread>

#include "../python_script.h"
#include "serve_process.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using testing::curl;

// Python computes in float32 with its own kernels; 1e-5 absolute on outputs of magnitude ~1.
constexpr double kTolerance = 1e-5;

// The image model: two inputs, logits and the class out, batched dynamically by two instances.
const std::string kTwoInputConfig = R"(name: "two_input"
platform: "pytorch_libtorch"
max_batch_size: 8
input [
  {
    name: "INPUT__0"
    data_type: TYPE_FP32
    dims: [ 1, 28, 28 ]
  },
  {
    name: "INPUT__1"
    data_type: TYPE_FP32
    dims: [ 8 ]
  }
]
output [
  {
    name: "OUTPUT__0"
    data_type: TYPE_FP32
    dims: [ 10 ]
  },
  {
    name: "OUTPUT__1"
    data_type: TYPE_INT64
    dims: [ 1 ]
  }
]
dynamic_batching {
  max_queue_delay_microseconds: 100000
}
instance_group [
  {
    count: 2
    kind: KIND_CPU
  }
]
)";

// int64 token indices and a bool mask, without a batch dimension: dims are the whole shapes.
const std::string kEmbeddingConfig = R"(platform: "pytorch_libtorch"
max_batch_size: 0
input [
  { name: "INPUT__0" data_type: TYPE_INT64 dims: [ 2, 6 ] },
  { name: "INPUT__1" data_type: TYPE_BOOL dims: [ 2, 6 ] }
]
output [
  { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2, 4 ] },
  { name: "OUTPUT__1" data_type: TYPE_INT64 dims: [ 2 ] },
  { name: "OUTPUT__2" data_type: TYPE_BOOL dims: [ 2 ] }
]
)";

// Inputs named after forward's arguments, listed in another order than forward's; outputs named
// freely, so they are the returned list's elements in the config's order.
const std::string kCastsConfig = R"(backend: "pytorch"
max_batch_size: 4
input [
  { name: "count" data_type: TYPE_INT32 dims: [ 3 ] },
  { name: "half" data_type: TYPE_FP16 dims: [ 3 ] },
  { name: "bf" data_type: TYPE_BF16 dims: [ 3 ] }
]
output [
  { name: "doubled" data_type: TYPE_FP16 dims: [ 3 ] },
  { name: "squared" data_type: TYPE_BF16 dims: [ 3 ] },
  { name: "tripled" data_type: TYPE_INT32 dims: [ 3 ] }
]
parameters: { key: "DISABLE_OPTIMIZED_EXECUTION" value: { string_value: "true" } }
)";

// A JSON array of numbers or booleans, nested to any depth, as a tensor of `type`.
torch::Tensor json_tensor(const nlohmann::json& data, torch::ScalarType type) {
  std::vector<double> values;
  std::vector<int64_t> shape;
  std::function<void(const nlohmann::json&, size_t)> walk = [&](const nlohmann::json& v, size_t depth) {
    if (!v.is_array()) {
      values.push_back(v.is_boolean() ? static_cast<double>(v.get<bool>()) : v.get<double>());
      return;
    }
    if (shape.size() == depth) shape.push_back(static_cast<int64_t>(v.size()));
    for (const auto& item : v) walk(item, depth + 1);
  };
  walk(data, 0);
  return torch::tensor(values, torch::kDouble).reshape(shape).to(type);
}

// The largest |served - python| over an output of a response, compared as doubles.
double difference(const nlohmann::json& output, const nlohmann::json& python) {
  const torch::Tensor served = json_tensor(output.at("data"), torch::kDouble);
  const torch::Tensor expected = json_tensor(python, torch::kDouble).flatten();
  EXPECT_EQ(served.numel(), expected.numel()) << output.dump().substr(0, 200);
  if (served.numel() != expected.numel()) return INFINITY;
  return (served - expected).abs().max().item<double>();
}

nlohmann::json input(const std::string& name, const std::string& datatype, const nlohmann::json& data,
                     torch::ScalarType type) {
  return {{"name", name}, {"shape", json_tensor(data, type).sizes().vec()}, {"datatype", datatype}, {"data", data}};
}

testing::HttpReply post(const testing::ServeProcess& server, const std::string& path, const nlohmann::json& body,
                        const std::string& file) {
  std::ofstream(file) << body.dump();
  return curl("--data-binary @" + file + " " + server.url(path));
}

class TorchScriptRepository : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto made = testing::run_python_script("torchscript_serving_models.py", dir_.path());
    if (!made) GTEST_SKIP() << testing::kNoPythonTorch;
    ASSERT_EQ(made->exit_code, 0) << made->output;
    io_ = nlohmann::json::parse(testing::read_text(dir_ / "io.json"));
    repo_ = dir_ / "models";
  }

  // The two_input model behind a bearer token, driven by tests/serve/SCRIPT (a tritonclient or
  // KServe client conformance script) at the server's gRPC target or HTTP URL: the report the script prints.
  nlohmann::json conformance(const std::string& script, bool grpc) {
    const std::string token = "a-token-of-the-test-0123456789";
    std::ofstream(dir_ / "token") << token << "\n";
    namespace fs = std::filesystem;
    fs::permissions(dir_ / "token", fs::perms::owner_read | fs::perms::owner_write);
    testing::write_repository_model(repo_, "two_input", kTwoInputConfig, dir_ / "two_input.pt");
    testing::ServeProcess server({"--model-repository", repo_, "--threads", "2", "--auth-token-file", dir_ / "token"},
                                 dir_ / "log");
    if (!server.wait_ready() || (grpc && server.grpc_port() == 0)) {
      ADD_FAILURE() << server.log();
      return nlohmann::json::object();
    }
    const auto r = testing::run_command(std::string(LOCKSTEP_PYTHON) + " " + LOCKSTEP_SOURCE_DIR + "/tests/serve/" +
                                        script + " " + (grpc ? server.grpc_target() : server.url("")) + " " +
                                        (dir_ / "two_input.pt") + " " + token + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(testing::last_json_line(r.output), nullptr, /*allow_exceptions=*/false);
  }

  void expect_kserve_client_works(bool grpc) {
    if (testing::run_command(std::string(LOCKSTEP_PYTHON) + " -c 'import kserve'").exit_code != 0)
      GTEST_SKIP() << "kserve is not installed in the venv (scripts/bootstrap --test)";
    const nlohmann::json report = conformance("kserve_client_conformance.py", grpc);
    ASSERT_TRUE(report.contains("checks")) << report;
    std::cout << "[ measured ] kserve " << report["kserve"].get<std::string>() << (grpc ? " gRPC, " : " REST, ")
              << report["checks"].size() << " checks\n";
    EXPECT_EQ(report["protocol"], grpc ? "grpc" : "rest");
    EXPECT_EQ(report["checks"].size(), 6u);
    for (const auto& [name, outcome] : report["checks"].items()) EXPECT_EQ(outcome, "ok") << name;
  }

  testing::TempDir dir_;
  nlohmann::json io_;
  std::string repo_;
};

TEST_F(TorchScriptRepository, ServesSeveralTypedInputsAndOutputsAsPythonComputesThem) {
  testing::write_repository_model(repo_, "two_input", kTwoInputConfig, dir_ / "two_input.pt");
  testing::write_repository_model(repo_, "embedding", kEmbeddingConfig, dir_ / "embedding.pt");
  testing::write_repository_model(repo_, "casts", kCastsConfig, dir_ / "casts.pt");
  testing::ServeProcess server({"--model-repository", repo_, "--threads", "2"}, dir_ / "log");
  ASSERT_TRUE(server.wait_ready()) << server.log();
  EXPECT_THAT(server.log(), HasSubstr("model 'two_input' version 1 READY (TorchScript, 2 instance(s)"));

  // The image model: five samples in one request.
  const nlohmann::json& two = io_["two_input"];
  const nlohmann::json request{{"inputs",
                                {input("INPUT__0", "FP32", two["inputs"][0], torch::kFloat),
                                 input("INPUT__1", "FP32", two["inputs"][1], torch::kFloat)}}};
  const auto reply = post(server, "/v2/models/two_input/infer", request, dir_ / "two.json");
  ASSERT_EQ(reply.status, 200) << reply.body;
  const nlohmann::json outputs = reply.json()["outputs"];
  ASSERT_EQ(outputs.size(), 2u) << reply.body;
  EXPECT_EQ(outputs[0]["name"], "OUTPUT__0");
  EXPECT_EQ(outputs[0]["shape"], nlohmann::json({5, 10}));
  EXPECT_EQ(outputs[1]["datatype"], "INT64");
  EXPECT_EQ(outputs[1]["shape"], nlohmann::json({5, 1}));
  const double logits = difference(outputs[0], two["outputs"][0]);
  std::cout << "[ measured ] two_input OUTPUT__0 (logits) against Python's module(image, features): max |difference| "
            << logits << "\n";
  EXPECT_LT(logits, kTolerance);
  EXPECT_EQ(difference(outputs[1], two["outputs"][1]), 0.0);

  // The same five samples as five requests at once: batched by two instances, each its own rows.
  std::vector<testing::HttpReply> singles(5);
  std::vector<std::thread> clients;
  for (size_t k = 0; k < 5; ++k)
    clients.emplace_back([&, k] {
      const nlohmann::json one{{"inputs",
                                {input("INPUT__0", "FP32", nlohmann::json::array({two["inputs"][0][k]}), torch::kFloat),
                                 input("INPUT__1", "FP32", nlohmann::json::array({two["inputs"][1][k]}), torch::kFloat)}}};
      singles[k] = post(server, "/v2/models/two_input/infer", one, dir_ / ("single" + std::to_string(k) + ".json"));
    });
  for (std::thread& t : clients) t.join();
  double batched = 0;
  for (size_t k = 0; k < 5; ++k) {
    ASSERT_EQ(singles[k].status, 200) << singles[k].body;
    batched = std::max(batched, difference(singles[k].json()["outputs"][0], two["outputs"][0][k]));
    EXPECT_EQ(difference(singles[k].json()["outputs"][1], two["outputs"][1][k]), 0.0);
  }
  const auto stats = curl(server.url("/v2/models/two_input/stats")).json()["model_stats"][0];
  std::cout << "[ measured ] five single-sample requests: max |difference| " << batched << ", "
            << stats["execution_count"] << " forward(s) for " << stats["inference_count"] << " samples\n";
  EXPECT_LT(batched, kTolerance);
  EXPECT_EQ(stats["inference_count"], 10);

  // Binary input data, and only OUTPUT__1 asked for.
  const torch::Tensor image = json_tensor(two["inputs"][0][3], torch::kFloat);     // (1, 28, 28)
  const torch::Tensor features = json_tensor(two["inputs"][1][3], torch::kFloat);  // (8)
  const nlohmann::json header{
      {"inputs",
       {{{"name", "INPUT__0"}, {"shape", {1, 1, 28, 28}}, {"datatype", "FP32"},
         {"parameters", {{"binary_data_size", 784 * 4}}}},
        {{"name", "INPUT__1"}, {"shape", {1, 8}}, {"datatype", "FP32"}, {"parameters", {{"binary_data_size", 32}}}}}},
      {"outputs", {{{"name", "OUTPUT__1"}}}}};
  std::string body = header.dump();
  body.append(static_cast<const char*>(image.data_ptr()), 784 * 4);
  body.append(static_cast<const char*>(features.data_ptr()), 32);
  std::ofstream(dir_ / "binary.bin", std::ios::binary) << body;
  const auto subset = curl("-H 'Inference-Header-Content-Length: " + std::to_string(header.dump().size()) +
                           "' --data-binary @" + (dir_ / "binary.bin") + " " + server.url("/v2/models/two_input/infer"));
  ASSERT_EQ(subset.status, 200) << subset.body;
  ASSERT_EQ(subset.json()["outputs"].size(), 1u) << subset.body;
  EXPECT_EQ(subset.json()["outputs"][0]["name"], "OUTPUT__1");
  EXPECT_EQ(subset.json()["outputs"][0]["data"], two["outputs"][1][3]);

  // int64 indices and a bool mask, no batch dimension.
  const nlohmann::json& emb = io_["embedding"];
  const auto embedded = post(server, "/v2/models/embedding/infer",
                             {{"inputs",
                               {input("INPUT__0", "INT64", emb["inputs"][0], torch::kLong),
                                input("INPUT__1", "BOOL", emb["inputs"][1], torch::kBool)}}},
                             dir_ / "embedding.json");
  ASSERT_EQ(embedded.status, 200) << embedded.body;
  const nlohmann::json e = embedded.json()["outputs"];
  ASSERT_EQ(e.size(), 3u) << embedded.body;
  EXPECT_EQ(e[0]["shape"], nlohmann::json({2, 4}));
  const double mean = difference(e[0], emb["outputs"][0]);
  std::cout << "[ measured ] embedding OUTPUT__0 (masked mean) against Python: max |difference| " << mean << "\n";
  EXPECT_LT(mean, kTolerance);
  EXPECT_EQ(e[1]["data"], emb["outputs"][1]);
  EXPECT_EQ(e[2]["datatype"], "BOOL");
  EXPECT_EQ(e[2]["data"], emb["outputs"][2]);

  // fp16, bf16 and int32, inputs named as forward's arguments.
  const nlohmann::json& casts = io_["casts"];
  const auto cast = post(server, "/v2/models/casts/infer",
                         {{"inputs",
                           {input("bf", "BF16", casts["inputs"][1], torch::kBFloat16),
                            input("count", "INT32", casts["inputs"][2], torch::kInt),
                            input("half", "FP16", casts["inputs"][0], torch::kHalf)}}},
                         dir_ / "casts.json");
  ASSERT_EQ(cast.status, 200) << cast.body;
  const nlohmann::json c = cast.json()["outputs"];
  ASSERT_EQ(c.size(), 3u) << cast.body;
  EXPECT_EQ(c[0]["name"], "doubled");
  EXPECT_EQ(c[0]["datatype"], "FP16");
  for (size_t k = 0; k < 3; ++k)  // values that fp16 and bf16 hold exactly
    EXPECT_EQ(difference(c[k], casts["outputs"][k]), 0.0) << c[k].dump();

  // Metadata lists every tensor; without a batch dimension, no -1.
  const auto metadata = curl(server.url("/v2/models/embedding")).json();
  EXPECT_EQ(metadata["platform"], "pytorch_libtorch");
  EXPECT_EQ(metadata["inputs"][1], nlohmann::json({{"name", "INPUT__1"}, {"datatype", "BOOL"}, {"shape", {2, 6}}}));
  EXPECT_EQ(metadata["outputs"].size(), 3u);

  // A request of the wrong datatype is a 400 naming the input and what the model takes.
  const auto wrong = post(server, "/v2/models/embedding/infer",
                          {{"inputs",
                            {input("INPUT__0", "FP32", emb["inputs"][0], torch::kFloat),
                             input("INPUT__1", "BOOL", emb["inputs"][1], torch::kBool)}}},
                          dir_ / "wrong.json");
  EXPECT_EQ(wrong.status, 400);
  EXPECT_THAT(wrong.json()["error"].get<std::string>(),
              HasSubstr("input 'INPUT__0' has datatype \"FP32\"; model 'embedding' takes INT64"));
}

// A file that is not TorchScript, and modules whose forward does not take what the config declares:
// each model is unavailable with the file, forward's signature or the failing input, and the fix.
TEST_F(TorchScriptRepository, AModuleThatDoesNotFitItsConfigIsNamedWithWhatWasExpected) {
  testing::write_repository_model(repo_, "not_torchscript", kEmbeddingConfig, "");
  std::ofstream(repo_ + "/not_torchscript/1/model.pt") << "a state dict, say";
  testing::write_repository_model(repo_, "scalar_arg",
                                  "platform: \"pytorch_libtorch\" max_batch_size: 4 "
                                  "input [ { name: \"INPUT__0\" data_type: TYPE_FP32 dims: [ 4 ] }, "
                                  "{ name: \"INPUT__1\" data_type: TYPE_INT64 dims: [ 1 ] } ] "
                                  "output [ { name: \"OUTPUT__0\" data_type: TYPE_FP32 dims: [ 4 ] } ]",
                                  dir_ / "scalar_arg.pt");
  std::string float_indices = kEmbeddingConfig;
  float_indices.replace(float_indices.find("TYPE_INT64"), 10, "TYPE_FP32");
  testing::write_repository_model(repo_, "float_indices", float_indices, dir_ / "embedding.pt");
  testing::write_repository_model(repo_, "one_input",
                                  "platform: \"pytorch_libtorch\" max_batch_size: 8 "
                                  "input [ { name: \"INPUT__0\" data_type: TYPE_FP32 dims: [ 1, 28, 28 ] } ] "
                                  "output [ { name: \"OUTPUT__0\" data_type: TYPE_FP32 dims: [ 10 ] } ]",
                                  dir_ / "two_input.pt");
  testing::write_repository_model(repo_, "casts", kCastsConfig, dir_ / "casts.pt");  // this one serves

  testing::ServeProcess server({"--model-repository", repo_, "--threads", "1", "--strict-readiness", "false"},
                               dir_ / "log");
  ASSERT_TRUE(server.wait_ready("/v2/models/casts/ready")) << server.log();
  auto reason = [&](const std::string& model) {
    const auto r = curl(server.url("/v2/models/" + model + "/ready"));
    EXPECT_EQ(r.status, 503) << model << ": " << r.body;
    const std::string message = r.json().value("error", "");
    std::cout << "[ message ] " << message << "\n";
    return message;
  };
  EXPECT_THAT(reason("not_torchscript"),
              HasSubstr("'not_torchscript/1/model.pt' is not a TorchScript module (torch.jit.save"));
  const std::string scalar = reason("scalar_arg");
  EXPECT_THAT(scalar, HasSubstr("'scalar_arg/1/model.pt' has forward("));
  EXPECT_THAT(scalar, HasSubstr("its argument 'k' is int, but config.pbtxt declares it input 'INPUT__1', a tensor of "
                                "TYPE_INT64; a served module's forward takes tensors"));
  const std::string indices = reason("float_indices");
  EXPECT_THAT(indices, HasSubstr("model 'float_indices' ('float_indices/1/model.pt') fails on zero inputs as "
                                 "config.pbtxt declares them ('INPUT__0' [2, 6] TYPE_FP32, 'INPUT__1' [2, 6] TYPE_BOOL)"));
  EXPECT_THAT(indices, HasSubstr("Long"));  // the embedding's own complaint: it takes integer indices
  const std::string count = reason("one_input");
  EXPECT_THAT(count, HasSubstr("'one_input/1/model.pt' has forward(__torch__.TwoInput self, Tensor image, Tensor "
                               "features) -> ((Tensor, Tensor)), which takes 2 argument(s), but config.pbtxt declares 1 "
                               "input(s): INPUT__0 (TYPE_FP32, dims [1, 28, 28])"));
}

// Triton's own HTTP client through its API (tests/serve/tritonclient_conformance.py): health,
// server and model metadata, get_model_config, infer in JSON and binary with all, some or default
// outputs, 16 async_infer requests at once over two instances, statistics counting what was
// inferred, the repository index, and refusals with their statuses; each answer equals the module's
// own in Python. Before: get_model_config got 404 (no /config endpoint).
TEST_F(TorchScriptRepository, TritonsHttpClientWorksThroughItsApi) {
  if (testing::run_command(std::string(LOCKSTEP_PYTHON) + " -c 'import tritonclient.http'").exit_code != 0)
    GTEST_SKIP() << "tritonclient is not installed in the venv (scripts/bootstrap --test)";
  const nlohmann::json report = conformance("tritonclient_conformance.py", /*grpc=*/false);
  ASSERT_TRUE(report.contains("checks")) << report;
  std::cout << "[ measured ] tritonclient " << report["tritonclient"].get<std::string>() << ", "
            << report["checks"].size() << " checks\n";
  EXPECT_EQ(report["checks"].size(), 12u);
  for (const auto& [name, outcome] : report["checks"].items()) EXPECT_EQ(outcome, "ok") << name;
}

// Triton's own gRPC client through its API (tests/serve/tritonclient_grpc_conformance.py): the
// health calls (no token), server and model metadata, get_model_config (as protobuf and as JSON),
// infer with all and some outputs, values in typed contents rather than raw bytes, 16 async_infer
// calls and 8 asyncio ones at once over two instances, statistics counting what was inferred, the
// repository index, and refusals with their status codes; each answer equals the module's own in
// Python. Before: no gRPC at all (connection refused on Triton's port 8001).
TEST_F(TorchScriptRepository, TritonsGrpcClientWorksThroughItsApi) {
  if (testing::run_command(std::string(LOCKSTEP_PYTHON) + " -c 'import tritonclient.grpc'").exit_code != 0)
    GTEST_SKIP() << "tritonclient[grpc] is not installed in the venv (scripts/bootstrap --test)";
  const nlohmann::json report = conformance("tritonclient_grpc_conformance.py", /*grpc=*/true);
  ASSERT_TRUE(report.contains("checks")) << report;
  std::cout << "[ measured ] tritonclient " << report["tritonclient"].get<std::string>() << ", grpcio "
            << report["grpcio"].get<std::string>() << ", " << report["checks"].size() << " checks\n";
  EXPECT_EQ(report["checks"].size(), 12u);
  for (const auto& [name, outcome] : report["checks"].items()) EXPECT_EQ(outcome, "ok") << name;
}

// KServe's own SDK clients (tests/serve/kserve_client_conformance.py), which differ from
// tritonclient: health answered as the v2 spec's JSON bodies, infer in JSON, in binary and 12 at
// once, a missing token and an unknown model refused; each answer equals the module's own in
// Python. Before: is_server_live failed parsing an empty body (REST), and every infer with raw
// contents was refused for its binary_data_size parameter (gRPC).
TEST_F(TorchScriptRepository, KServesOwnRestClientWorks) { expect_kserve_client_works(/*grpc=*/false); }

TEST_F(TorchScriptRepository, KServesOwnGrpcClientWorks) { expect_kserve_client_works(/*grpc=*/true); }

}  // namespace
}  // namespace lockstep
