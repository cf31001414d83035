// config.pbtxt: the Triton-style subset parses into the settings it names, an unknown field or a
// syntax error is named by line and column, and values that cannot fit the model are refused.
#include "lockstep/serve/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../test_util.h"
#include "lockstep/serve/http_protocol.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;

const char* kTritonStyle = R"(name: "classifier"
backend: "lockstep"
max_batch_size: 32
parameters: { key: "architecture" value: { string_value: "convnet" } }
input [ { name: "images", data_type: TYPE_FP32, dims: [ 1, 28, 28 ] } ]
output [ { name: "scores", data_type: TYPE_FP32, dims: [ 10 ] } ]
dynamic_batching {
  preferred_batch_size: [ 16, 8 ]
  max_queue_delay_microseconds: 500
  default_queue_policy { max_queue_size: 100 default_timeout_microseconds: 2000000 }
}
instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_CPU } ]
version_policy: { latest: { num_versions: 2 } }
)";

TEST(ModelConfig, ReadsEveryFieldOfTheTritonStyleSubset) {
  const serve::ModelConfig c = serve::parse_model_config(kTritonStyle, "classifier/config.pbtxt", "classifier");
  EXPECT_EQ(c.name, "classifier");
  EXPECT_EQ(c.architecture, "convnet");
  EXPECT_EQ(c.max_batch_size, 32);
  ASSERT_EQ(c.inputs.size(), 1u);
  EXPECT_EQ(c.inputs[0].name, "images");
  EXPECT_EQ(c.inputs[0].datatype, "FP32");
  EXPECT_EQ(c.inputs[0].dims, (std::vector<int64_t>{1, 28, 28}));
  ASSERT_EQ(c.outputs.size(), 1u);
  EXPECT_EQ(c.outputs[0].name, "scores");
  EXPECT_EQ(c.outputs[0].dims, (std::vector<int64_t>{10}));
  EXPECT_TRUE(c.dynamic_batching);
  EXPECT_EQ(c.preferred_batch_sizes, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(c.max_queue_delay_us, 500);
  EXPECT_EQ(c.max_queue_size, 100);
  EXPECT_EQ(c.queue_timeout_us, 2000000);
  EXPECT_EQ(c.instance_count, 3);  // 2, and 1 for a group without a count (Triton's default)
  EXPECT_EQ(c.version_policy.kind, serve::VersionPolicyKind::kLatest);
  EXPECT_EQ(c.version_policy.num_versions, 2);
}

// A load's config override is the JSON the config endpoint returns (a client fetches it, changes a
// field and loads the model with it): that JSON reads back as the same configuration.
TEST(ModelConfig, TheConfigEndpointsJsonReadsBackAsTheSameConfig) {
  const serve::ModelConfig c = serve::parse_model_config(kTritonStyle, "classifier/config.pbtxt", "classifier");
  const nlohmann::json j = serve::model_config_json(c);
  const serve::ModelConfig back = serve::parse_model_config_json(j.dump(), "the override", "classifier");
  EXPECT_EQ(serve::model_config_json(back), j);
  EXPECT_EQ(back.architecture, "convnet");
  EXPECT_EQ(back.inputs[0].name, "images");
  EXPECT_EQ(back.preferred_batch_sizes, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(back.instance_count, 3);
  // protobuf's JSON names (lowerCamelCase) and int64s as strings, as Triton itself writes dims
  nlohmann::json camel = j;
  camel["maxBatchSize"] = 16;
  camel.erase("max_batch_size");
  camel["input"][0]["dims"] = {"1", "28", "28"};
  EXPECT_EQ(serve::parse_model_config_json(camel.dump(), "the override", "classifier").max_batch_size, 16);
}

TEST(ModelConfig, AJsonConfigThatIsNotOneIsRefusedNamingTheField) {
  const nlohmann::json good = serve::model_config_json(
      serve::parse_model_config(kTritonStyle, "classifier/config.pbtxt", "classifier"));
  auto refusal = [](const nlohmann::json& j) {
    return testing::error_message([&] { serve::parse_model_config_json(j.dump(), "the override", "classifier"); });
  };
  nlohmann::json unknown = good;
  unknown["optimization"] = nlohmann::json::object();  // Triton has it; this server reads no such field
  EXPECT_THAT(refusal(unknown), HasSubstr("optimization"));
  EXPECT_THAT(refusal(unknown), HasSubstr("the override: "));
  nlohmann::json wrong_type = good;
  wrong_type["max_batch_size"] = "many";
  EXPECT_THAT(refusal(wrong_type), HasSubstr("max_batch_size"));
  nlohmann::json other_name = good;
  other_name["name"] = "b";
  EXPECT_THAT(refusal(other_name), HasSubstr("name 'b' differs from its directory 'classifier'"));
  EXPECT_THAT(testing::error_message([] { serve::parse_model_config_json("{\"max_batch_size\": ", "the override", "x"); }),
              HasSubstr("the override: "));
}

TEST(ModelConfig, WithoutDynamicBatchingEachRequestRunsAlone) {
  const serve::ModelConfig c = serve::parse_model_config(
      "platform: \"lockstep\" max_batch_size: 8 input { name: \"input\" data_type: TYPE_FP32 dims: [1, 28, 28] } "
      "output { name: \"logits\" data_type: TYPE_FP32 dims: [10] }",
      "mlp/config.pbtxt", "mlp");
  EXPECT_EQ(c.architecture, "mlp");  // from the name
  EXPECT_FALSE(c.dynamic_batching);
  EXPECT_EQ(c.instance_count, 1);
}

TEST(ModelConfig, UnknownFieldIsNamedWithItsLineAndColumn) {
  const std::string text = "name: \"convnet\"\nbackend: \"lockstep\"\n  max_batch_sizes: 8\n";
  const std::string message =
      testing::error_message([&] { serve::parse_model_config(text, "repo/convnet/config.pbtxt", "convnet"); });
  // Line 3; the column is where protobuf's parser stands when it sees the name (after it).
  EXPECT_THAT(message, ::testing::ContainsRegex("repo/convnet/config.pbtxt:3:[0-9]+:"));
  EXPECT_THAT(message, HasSubstr("max_batch_sizes"));
}

TEST(ModelConfig, SyntaxErrorIsNamedWithItsLine) {
  const std::string message = testing::error_message(
      [] { serve::parse_model_config("name: \"convnet\"\ninput [ { name: \"input\" \n", "c.pbtxt", "convnet"); });
  EXPECT_THAT(message, HasSubstr("c.pbtxt:3:"));
}

TEST(ModelConfig, RefusesWhatDoesNotFitTheModel) {
  const std::string base = "backend: \"lockstep\" max_batch_size: 8 output { name: \"logits\" data_type: TYPE_FP32 dims: [10] } ";
  const std::string fp32_input = "input { name: \"input\" data_type: TYPE_FP32 dims: [1, 28, 28] } ";
  struct Case {
    std::string text, message;
  };
  const std::vector<Case> cases{
      {base + "input { name: \"input\" data_type: TYPE_FP32 dims: [3, 32, 32] }",
       "dims [3, 32, 32] do not fit a convnet, which takes [1, 28, 28]"},
      {base + "input { name: \"input\" data_type: TYPE_FP16 dims: [1, 28, 28] }", "TYPE_FP16"},
      {"backend: \"onnxruntime\" max_batch_size: 8", "backend 'onnxruntime' is not served here"},
      {"backend: \"lockstep\" max_batch_size: 0", "max_batch_size 0 must be at least 1"},
      {base + fp32_input + "dynamic_batching { preferred_batch_size: 9 }", "preferred_batch_size 9"},
      {base + fp32_input + "instance_group { kind: KIND_GPU }", "KIND_GPU"},
      {base + fp32_input + "instance_group { count: 1000000 }",
       "instance_group count 1000000 makes 1000000 instances; a model has at most 64"},
      {base + fp32_input + "instance_group [ { count: 40 }, { count: 40 } ]", "makes 80 instances"},
      {"name: \"other\"", "differs from its directory 'convnet'"},
  };
  for (const Case& c : cases)
    EXPECT_THAT(testing::error_message([&] { serve::parse_model_config(c.text, "config.pbtxt", "convnet"); }),
                HasSubstr(c.message))
        << c.text;
}

// Triton's PyTorch backend: a TorchScript model.pt with the inputs and outputs the config names.
TEST(ModelConfig, ReadsTritonsPyTorchBackendConfig) {
  const std::string io = "input [ { name: \"INPUT__0\" data_type: TYPE_FP32 dims: [ 3, 8 ] } ] "
                         "output [ { name: \"OUTPUT__0\" data_type: TYPE_FP32 dims: [ 5 ] } ] ";
  for (const std::string& kind : {"platform: \"pytorch_libtorch\" ", "backend: \"pytorch\" "}) {
    const serve::ModelConfig c = serve::parse_model_config(
        kind + "max_batch_size: 4 " + io + "parameters: { key: \"DISABLE_OPTIMIZED_EXECUTION\" value: { string_value: "
               "\"true\" } } instance_group [ { count: 3 } ]",
        "config.pbtxt", "anything");
    EXPECT_EQ(c.format, serve::ModelFormat::kTorchScript) << kind;
    EXPECT_EQ(c.inputs.at(0).name, "INPUT__0");
    EXPECT_EQ(c.inputs.at(0).dims, (std::vector<int64_t>{3, 8}));
    EXPECT_EQ(c.outputs.at(0).dims, (std::vector<int64_t>{5}));
    EXPECT_EQ(c.instance_count, 3);
  }
  const std::string torchscript = "platform: \"pytorch_libtorch\" max_batch_size: 4 ";
  EXPECT_THAT(testing::error_message([&] {
                serve::parse_model_config(torchscript + io + "parameters: { key: \"X\" value: { string_value: \"1\" } }",
                                          "config.pbtxt", "m");
              }),
              HasSubstr("config.pbtxt: unknown parameter 'X' for the PyTorch backend"));
}

// Several inputs and outputs of Triton's datatypes, and max_batch_size 0 (no batch dimension).
TEST(ModelConfig, ReadsSeveralTypedTensorsAndNoBatchDimensionForTorchScript) {
  const serve::ModelConfig c = serve::parse_model_config(R"(platform: "pytorch_libtorch"
max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_INT64 dims: [ 2, 6 ] },
        { name: "INPUT__1" data_type: TYPE_BOOL dims: [ 2, 6 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2, 4 ] },
         { name: "OUTPUT__1" data_type: TYPE_BF16 dims: [ 2 ] },
         { name: "OUTPUT__2" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "OUTPUT__3" data_type: TYPE_FP16 dims: [ 1 ] } ]
)", "embed/config.pbtxt", "embed");
  EXPECT_EQ(c.max_batch_size, 0);
  ASSERT_EQ(c.inputs.size(), 2u);
  EXPECT_EQ(c.inputs[1].name, "INPUT__1");
  EXPECT_EQ(c.inputs[1].datatype, "BOOL");
  EXPECT_EQ(c.inputs[1].dims, (std::vector<int64_t>{2, 6}));
  ASSERT_EQ(c.outputs.size(), 4u);
  std::vector<c10::ScalarType> types;
  for (const auto& t : c.outputs) types.push_back(serve::scalar_type(t.datatype));
  EXPECT_EQ(types, (std::vector<c10::ScalarType>{c10::kFloat, c10::kBFloat16, c10::kInt, c10::kHalf}));
  EXPECT_EQ(serve::scalar_type(c.inputs[0].datatype), c10::kLong);
  EXPECT_EQ(serve::request_shape(c, c.inputs[0], 3), (std::vector<int64_t>{2, 6}));  // dims are the whole shape

  const std::string head = "platform: \"pytorch_libtorch\" max_batch_size: 4 ";
  const std::string out = "output [ { name: \"OUTPUT__0\" data_type: TYPE_FP32 dims: [ 5 ] } ] ";
  struct Case {
    std::string text, message;
  };
  const std::vector<Case> cases{
      {head + "input [ { name: \"x\" data_type: TYPE_STRING dims: [ 1 ] } ] " + out,
       "input 'x' has data_type TYPE_STRING; lockstep serves TYPE_FP32, TYPE_FP16, TYPE_BF16, TYPE_INT64, TYPE_INT32, "
       "TYPE_BOOL"},
      {head + "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 1 ] }, { name: \"x\" data_type: TYPE_FP32 dims: "
              "[ 2 ] } ] " + out,
       "two inputs are named 'x'"},
      {head + "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ -1, 4 ] } ] " + out,
       "input 'x' dims [-1, 4] must be sizes of at least 1 (variable sizes, -1, are not served)"},
      {head + out, "no input; list the module's inputs"},
      {"platform: \"pytorch_libtorch\" max_batch_size: -1 " + out, "max_batch_size -1 must be at least 0"},
  };
  for (const Case& k : cases)
    EXPECT_THAT(testing::error_message([&] { serve::parse_model_config(k.text, "config.pbtxt", "m"); }),
                HasSubstr(k.message))
        << k.text;
}

TEST(ModelConfig, VersionPolicyPicksVersionsAsTritonDoes) {
  const std::vector<int64_t> available{3, 1, 7};
  EXPECT_EQ(serve::select_versions({}, available), (std::vector<int64_t>{7}));
  serve::VersionPolicy latest2{serve::VersionPolicyKind::kLatest, 2, {}};
  EXPECT_EQ(serve::select_versions(latest2, available), (std::vector<int64_t>{3, 7}));
  serve::VersionPolicy all{serve::VersionPolicyKind::kAll, 1, {}};
  EXPECT_EQ(serve::select_versions(all, available), (std::vector<int64_t>{1, 3, 7}));
  serve::VersionPolicy specific{serve::VersionPolicyKind::kSpecific, 1, {1, 7}};
  EXPECT_EQ(serve::select_versions(specific, available), (std::vector<int64_t>{1, 7}));
}

}  // namespace
}  // namespace lockstep
