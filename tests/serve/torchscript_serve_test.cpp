// A model defined in Python and saved as TorchScript, served from a repository laid out for Triton's
// PyTorch backend (platform "pytorch_libtorch", 1/model.pt, INPUT__0 / OUTPUT__0): its outputs over
// HTTP equal Python's module(x). A file that is not TorchScript leaves the model unavailable, naming
// the file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>

#include "../python_script.h"
#include "serve_process.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using testing::curl;

// Python computes in float32 with its own kernels; 1e-5 absolute on outputs of magnitude ~1.
constexpr double kTolerance = 1e-5;

const std::string kTritonConfig =
    "platform: \"pytorch_libtorch\"\n"
    "max_batch_size: 8\n"
    "input [ { name: \"INPUT__0\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n"
    "output [ { name: \"OUTPUT__0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
    "parameters: { key: \"INFERENCE_MODE\" value: { string_value: \"true\" } }\n"
    "dynamic_batching { max_queue_delay_microseconds: 1000 }\n"
    "instance_group [ { count: 2 kind: KIND_CPU } ]\n";

TEST(TorchScriptServe, APythonModelServesAsTritonsPyTorchBackendWouldAndAnswersAsPythonDoes) {
  testing::TempDir dir;
  const auto made = testing::run_python_script("torchscript_models.py", dir.path());
  if (!made) GTEST_SKIP() << testing::kNoPythonTorch;
  ASSERT_EQ(made->exit_code, 0) << made->output;
  const std::string repo = dir / "repo";
  testing::write_repository_model(repo, "residual_mlp", kTritonConfig, dir / "residual_mlp.pt");
  testing::write_repository_model(repo, "not_torchscript", kTritonConfig, "");
  std::ofstream(repo + "/not_torchscript/1/model.pt") << "not a zip archive";
  testing::write_repository_model(repo, "tensors", kTritonConfig, "");
  torch::save(torch::zeros({2}), repo + "/tensors/1/model.pt");  // TorchScript's archive, but no module

  testing::ServeProcess server({"--model-repository", repo, "--threads", "1", "--strict-readiness", "false"},
                               dir / "log");
  ASSERT_TRUE(server.wait_ready("/v2/models/residual_mlp/ready")) << server.log();
  EXPECT_THAT(server.log(), HasSubstr("model 'residual_mlp' version 1 READY (TorchScript, 2 instance(s)"));

  const nlohmann::json io = nlohmann::json::parse(testing::read_text(dir / "residual_mlp_io.json"));
  const nlohmann::json request{{"inputs",
                                {{{"name", "INPUT__0"}, {"shape", {5, 16}}, {"datatype", "FP32"}, {"data", io["input"]}}}}};
  std::ofstream(dir / "request.json") << request.dump();
  const auto reply = curl("--data-binary @" + (dir / "request.json") + " " + server.url("/v2/models/residual_mlp/infer"));
  ASSERT_EQ(reply.status, 200) << reply.body;
  const nlohmann::json out = reply.json()["outputs"][0];
  EXPECT_EQ(out["name"], "OUTPUT__0");
  EXPECT_EQ(out["shape"], nlohmann::json({5, 4}));
  const torch::Tensor served = torch::tensor(out["data"].get<std::vector<float>>()).reshape({5, 4});
  std::vector<float> expected;
  for (const auto& row : io["output"])
    for (float v : row.get<std::vector<float>>()) expected.push_back(v);
  const double difference = (served - torch::tensor(expected).reshape({5, 4})).abs().max().item<double>();
  std::cout << "[ measured ] served against Python's module(x): max |difference| " << difference << "\n";
  EXPECT_LT(difference, kTolerance);
  const auto metadata = curl(server.url("/v2/models/residual_mlp")).json();
  EXPECT_EQ(metadata["platform"], "pytorch_libtorch");
  EXPECT_EQ(metadata["inputs"][0]["shape"], nlohmann::json({-1, 16}));

  const auto broken = curl(server.url("/v2/models/not_torchscript/ready"));
  EXPECT_EQ(broken.status, 503);
  EXPECT_THAT(broken.json()["error"].get<std::string>(),
              HasSubstr("'not_torchscript/1/model.pt' is not a TorchScript module (torch.jit.save"));
  const auto tensors = curl(server.url("/v2/models/tensors/ready"));
  EXPECT_EQ(tensors.status, 503);
  EXPECT_THAT(tensors.json()["error"].get<std::string>(),
              HasSubstr("'tensors/1/model.pt' holds TorchScript without a forward method"));
}

}  // namespace
}  // namespace lockstep
