// KServe v2 infer messages: JSON data flat or nested and binary tensor data give the same tensor,
// every malformed request is a 400 naming what is wrong, and the binary response is the JSON
// header followed by the raw little-endian floats.
#include "lockstep/serve/http_protocol.h"

#include "../test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <random>

namespace lockstep {
namespace {

using ::testing::HasSubstr;

serve::ModelConfig small_config() {
  serve::ModelConfig c = serve::default_model_config("convnet");
  c.inputs[0].dims = {1, 2, 2};  // small tensors for readable requests; parsing only reads the config
  c.max_batch_size = 4;
  return c;
}

TEST(HttpProtocol, FlatAndNestedJsonDataGiveTheSameTensor) {
  const auto config = small_config();
  const auto flat = serve::parse_infer_request(
      R"({"id":"a1","inputs":[{"name":"input","shape":[2,1,2,2],"datatype":"FP32","data":[1,2,3,4,5,6,7,8.5]}]})",
      std::nullopt, config);
  const auto nested = serve::parse_infer_request(
      R"({"inputs":[{"name":"input","shape":[2,1,2,2],"datatype":"FP32","data":[[[[1,2],[3,4]]],[[[5,6],[7,8.5]]]]}]})",
      std::nullopt, config);
  EXPECT_EQ(flat.id, "a1");
  ASSERT_EQ(flat.inputs.size(), 1u);
  EXPECT_EQ(flat.inputs[0].sizes(), torch::IntArrayRef({2, 1, 2, 2}));
  EXPECT_TRUE(torch::equal(flat.inputs[0], nested.inputs[0]));
  EXPECT_FLOAT_EQ(flat.inputs[0][1][0][1][1].item<float>(), 8.5f);
  ASSERT_EQ(flat.outputs.size(), 1u);  // every output, as JSON
  EXPECT_FALSE(flat.outputs[0].binary);
}

// The numbers of a request's data as a JSON DOM reads them: nlohmann's parse, then get<float>.
std::vector<float> dom_values(const std::string& body) {
  std::vector<float> out;
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& v) {
    if (v.is_array()) {
      for (const auto& item : v) walk(item);
    } else {
      out.push_back(v.get<float>());
    }
  };
  walk(nlohmann::json::parse(body)["inputs"][0]["data"]);
  return out;
}

// See Note [Reading tensor data without a JSON DOM]: every way JSON can write a number, in flat and
// nested arrays with any whitespace, gives the bits the DOM gives.
TEST(HttpProtocol, DataReadWithoutADomHasTheDomsBitsForEveryNumberSpelling) {
  serve::ModelConfig config = small_config();
  config.inputs[0].dims = {1, 8, 8};
  std::mt19937_64 rng(7);
  // Spellings to parse, not results of training: strtod and the DOM round them by IEEE-754 rules,
  // the same on every x86-64 CPU.
  std::vector<std::string> numbers{"0", "-0", "-0.0", "1", "-1", "1E5", "2.5e-3", "-7e+2", "4.9e-324", "1e-310",
                                   "3.4028235e38", "-3.4028235e38", "1e-50", "123456789012345678901234567890",
                                   "0.1", "0.30000000000000004", "16777217", "3.1415926535897932384626"};
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  const char* formats[] = {"%.17g", "%.9g", "%.3e", "%.0f", "%g"};
  while (numbers.size() < 4 * 64) {
    char buf[64];
    const double v = uniform(rng) * std::pow(10.0, static_cast<int>(rng() % 20) - 10);
    std::snprintf(buf, sizeof(buf), formats[rng() % 5], v);
    numbers.push_back(buf);
  }
  const char* spaces[] = {"", " ", "\n", "\t ", "\r\n  "};
  auto space = [&] { return std::string(spaces[rng() % 5]); };
  std::string flat = "[", nested = "[";
  for (size_t i = 0; i < numbers.size(); ++i) {
    flat += space() + numbers[i] + space() + (i + 1 < numbers.size() ? "," : "]");
    if (i % 64 == 0) nested += space() + "[[";  // (4, 1, 8, 8): each sample [[row, ...]]
    if (i % 8 == 0) nested += "[";
    nested += space() + numbers[i] + space();
    nested += i % 8 == 7 ? "]" : ",";
    if (i % 64 == 63) nested += "]]" + space() + (i + 1 < numbers.size() ? "," : "]");
    else if (i % 8 == 7) nested += ",";
  }
  for (const std::string& data : {flat, nested}) {
    // data before the other fields, and a "data" key deeper down that is not the tensor's
    const std::string body = R"({ "inputs" : [ { "data" :)" + data +
                             R"(, "name":"input","shape":[4,1,8,8],"datatype":"FP32","extra":{"data":[1]}}]})";
    const std::vector<float> expected = dom_values(body);
    ASSERT_EQ(expected.size(), numbers.size());
    const auto r = serve::parse_infer_request(body, std::nullopt, config);
    ASSERT_EQ(r.inputs.at(0).numel(), static_cast<int64_t>(expected.size()));
    const float* got = r.inputs[0].data_ptr<float>();
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_EQ(std::memcmp(got + i, &expected[i], sizeof(float)), 0)
          << "number " << i << " '" << numbers[i] << "': read " << got[i] << ", the DOM gives " << expected[i];
  }
}

std::string binary_body(const std::string& header, const std::vector<float>& values) {
  std::string body = header;
  body.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return body;
}

TEST(HttpProtocol, BinaryTensorDataFollowsTheJsonHeader) {
  const std::string header =
      R"({"inputs":[{"name":"input","shape":[1,1,2,2],"datatype":"FP32","parameters":{"binary_data_size":16}}],)"
      R"("outputs":[{"name":"logits","parameters":{"binary_data":true}}]})";
  const auto r = serve::parse_infer_request(binary_body(header, {0.5f, -1, 2, 3.25f}), header.size(), small_config());
  EXPECT_TRUE(torch::equal(r.inputs.at(0), torch::tensor({0.5f, -1.0f, 2.0f, 3.25f}).reshape({1, 1, 2, 2})));
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_TRUE(r.outputs[0].binary);
}

TEST(HttpProtocol, BinaryResponseIsTheJsonHeaderThenTheFloats) {
  serve::InferRequest request;
  request.outputs = {{0, /*binary=*/true}};
  request.id = "x";
  const torch::Tensor logits = torch::arange(20, torch::kFloat).reshape({2, 10}) / 4;
  const auto response = serve::make_infer_response(request, small_config(), 3, {logits});
  ASSERT_TRUE(response.header_length.has_value());
  const auto header = nlohmann::json::parse(response.body.substr(0, *response.header_length));
  EXPECT_EQ(header["model_version"], "3");
  EXPECT_EQ(header["id"], "x");
  EXPECT_EQ(header["outputs"][0]["shape"], nlohmann::json({2, 10}));
  EXPECT_EQ(header["outputs"][0]["parameters"]["binary_data_size"], 80);
  ASSERT_EQ(response.body.size(), *response.header_length + 80);
  std::vector<float> values(20);
  std::memcpy(values.data(), response.body.data() + *response.header_length, 80);
  EXPECT_TRUE(torch::equal(torch::tensor(values).reshape({2, 10}), logits));
}

TEST(HttpProtocol, JsonResponseCarriesTheLogitsAsNumbers) {
  const torch::Tensor logits = torch::tensor({{0.1f, -2.5f, 1e-7f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f, 9.f}});
  serve::InferRequest request;
  request.outputs = {{0, /*binary=*/false}};
  const auto response = serve::make_infer_response(request, small_config(), 1, {logits});
  EXPECT_FALSE(response.header_length.has_value());
  const auto j = nlohmann::json::parse(response.body);
  EXPECT_EQ(j["model_name"], "convnet");
  EXPECT_EQ(j["outputs"][0]["name"], "logits");
  const auto data = j["outputs"][0]["data"].get<std::vector<float>>();
  EXPECT_TRUE(torch::equal(torch::tensor(data).reshape({1, 10}), logits));  // floats round-trip exactly
}

// Issue 53 item 23: NaN outputs were answered as JSON null with a 200 (a missing value to the
// client). They are written as Triton writes them, NaN, Infinity and -Infinity, which Python's json
// (tritonclient's parser) reads back; finite outputs keep their bytes (See Note [Non-finite outputs
// in JSON]).
TEST(HttpProtocol, NonFiniteOutputsAreWrittenAsTritonWritesThem) {
  const float inf = std::numeric_limits<float>::infinity();
  const torch::Tensor logits =
      torch::tensor({{0.5f, std::numeric_limits<float>::quiet_NaN(), inf, -inf, 1e-7f, 5.f, 6.f, 7.f, 8.f, 9.f}});
  serve::InferRequest request;
  request.id = "NaN]},{\"x";  // a request's id cannot reach into the hand-written part
  request.outputs = {{0, /*binary=*/false}};
  const std::string body = serve::make_infer_response(request, small_config(), 1, {logits}).body;
  EXPECT_THAT(body, HasSubstr("\"data\":[0.5,NaN,Infinity,-Infinity,1.0000000116860974e-07,5.0,6.0,7.0,8.0,9.0]"));
  EXPECT_THAT(body, ::testing::StartsWith("{\"id\":\"NaN]},{\\\"x\",\"model_name\":\"convnet\""));
  // Python's json reads it back, as tritonclient does.
  const std::string python = testing::python_with_torch();
  if (!python.empty()) {
    testing::TempDir dir;
    std::ofstream(dir / "r.json") << body;
    const auto r = testing::run_command(python + " -c \"import json, sys; d = json.load(open(sys.argv[1]));"
                                                 " print(d['id'], d['outputs'][0]['data'][:4])\" " + (dir / "r.json"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("NaN]},{\"x [0.5, nan, inf, -inf]"));
  }
  // All finite: the bytes nlohmann writes for the whole response, as before.
  const torch::Tensor finite = torch::arange(10, torch::kFloat).reshape({1, 10});
  request.id = "r1";
  nlohmann::json expected{{"id", "r1"}, {"model_name", "convnet"}, {"model_version", "1"},
                          {"outputs", {{{"name", "logits"}, {"datatype", "FP32"}, {"shape", {1, 10}},
                                        {"data", std::vector<float>(10)}}}}};
  for (int i = 0; i < 10; ++i) expected["outputs"][0]["data"][i] = static_cast<float>(i);
  EXPECT_EQ(serve::make_infer_response(request, small_config(), 1, {finite}).body, expected.dump());
}

TEST(HttpProtocol, EveryMalformedRequestIsA400NamingTheProblem) {
  const std::string ok_input = R"("name":"input","shape":[1,1,2,2],"datatype":"FP32")";
  const std::string header12 = "{\"inputs\":[{" + ok_input + ",\"parameters\":{\"binary_data_size\":12}}]}";
  const std::string header16 = "{\"inputs\":[{" + ok_input + ",\"parameters\":{\"binary_data_size\":16}}]}";
  const std::string data_and_binary =
      "{\"inputs\":[{" + ok_input + ",\"data\":[1,2,3,4],\"parameters\":{\"binary_data_size\":16}}]}";
  struct Case {
    std::string body;
    std::optional<size_t> header_length;
    std::string message;
  };
  const std::vector<Case> cases{
      {R"({"inputs":[)", std::nullopt, "malformed JSON"},
      {"[1,2]", std::nullopt, "must be a JSON object"},
      {R"({"id":"a"})", std::nullopt, "no \"inputs\" array"},
      {R"({"inputs":[{"name":"image","shape":[1,1,2,2],"datatype":"FP32","data":[1,2,3,4]}]})", std::nullopt,
       "unknown input 'image'; model 'convnet' takes 'input'"},
      {R"({"inputs":[{"name":"input","shape":[1,1,2,2],"datatype":"FP64","data":[1,2,3,4]}]})", std::nullopt,
       "datatype \"FP64\"; model 'convnet' takes FP32"},
      {R"({"inputs":[{"name":"input","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]}]})", std::nullopt,
       "has shape [1, 2, 2]; model 'convnet' takes [-1, 1, 2, 2] with at most 4 samples"},
      {R"({"inputs":[{"name":"input","shape":[5,1,2,2],"datatype":"FP32","data":[]}]})", std::nullopt,
       "has shape [5, 1, 2, 2]"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[1,2,3]}]}", std::nullopt, "has 3 values; shape [1, 1, 2, 2] needs 4"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[1,\"2\",3,4]}]}", std::nullopt, "data holds string"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[1,2,3,1e400]}]}", std::nullopt, "number overflow parsing '1e400'"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[1,2,3,+4]}]}", std::nullopt, "malformed JSON"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[1,2,3,04]}]}", std::nullopt, "malformed JSON"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[1,2,3,4.]}]}", std::nullopt, "malformed JSON"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[1,2,3,NaN]}]}", std::nullopt, "malformed JSON"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[1,2,3,4,]}]}", std::nullopt, "malformed JSON"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[1,2,3,4]]}]}", std::nullopt, "malformed JSON"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[1,2,3,4]}", std::nullopt, "malformed JSON"},
      {"{\"inputs\":[{" + ok_input + "}]}", std::nullopt, "neither \"data\" nor parameters.binary_data_size"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[1,2,3,4]}],\"outputs\":[{\"name\":\"probs\"}]}", std::nullopt,
       "unknown output \"probs\""},
      {header16, std::nullopt,
       "no Inference-Header-Content-Length header"},
      {header12 + std::string(12, 'x'), header12.size(),
       "binary_data_size 12 does not match shape [1, 1, 2, 2] of FP32, which is 16 bytes"},
      {header16 + std::string(10, 'x'), header16.size(),
       "the body holds 10 bytes after the JSON header"},
      {"{}", 500, "Inference-Header-Content-Length 500 is more than the body's 2 bytes"},
      // both kinds of data: Triton refuses them; the JSON was silently ignored before
      {data_and_binary + std::string(16, 'x'), data_and_binary.size(),
       "input 'input' has both \"data\" and parameters.binary_data_size"},
      {data_and_binary, std::nullopt, "input 'input' has both \"data\" and parameters.binary_data_size"},
      // values: within FP32's range (1e39 was answered with nulls), nested as the shape or flat
      {"{\"inputs\":[{" + ok_input + ",\"data\":[1,2,3,1e39]}]}", std::nullopt,
       "value 3 is outside FP32's range"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[[-1e39],2,3,4]}]}", std::nullopt, "nested unlike its shape"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[[[[1,2,3],[4]]]]}]}", std::nullopt,
       "data is nested unlike its shape [1, 1, 2, 2]"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[[1,2],[3,4]]}]}", std::nullopt, "nested unlike its shape"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[1,[2,[3]],4]}]}", std::nullopt, "nested unlike its shape"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[[[[1,\"2\"],[3,4]]]]}]}", std::nullopt, "data holds string"},
      // parameters the server would ignore are refused, as Triton refuses what it does not support
      {"{\"inputs\":[{" + ok_input + ",\"data\":[1,2,3,4]}],\"outputs\":[{\"name\":\"logits\","
       "\"parameters\":{\"classification\":3}}]}", std::nullopt,
       "output 'logits' parameter 'classification' is not supported by this server"},
      {"{\"inputs\":[{" + ok_input + ",\"parameters\":{\"shared_memory_region\":\"r\"}}]}", std::nullopt,
       "input 'input' parameter 'shared_memory_region' is not supported"},
      {"{\"inputs\":[{" + ok_input + ",\"data\":[1,2,3,4]}],\"parameters\":{\"priority\":1}}", std::nullopt,
       "the request's parameter 'priority' is not supported"},
  };
  for (const Case& c : cases) {
    try {
      serve::parse_infer_request(c.body, c.header_length, small_config());
      ADD_FAILURE() << "accepted: " << c.body;
    } catch (const serve::HttpError& e) {
      EXPECT_EQ(e.status(), 400) << c.body;
      EXPECT_THAT(e.what(), HasSubstr(c.message)) << c.body;
    }
  }
}

// A TorchScript model as Triton's PyTorch backend serves it: an image, int64 indices and a bool
// mask in; fp16, int64 and bool out.
serve::ModelConfig typed_config(int64_t max_batch_size) {
  serve::ModelConfig c;
  c.name = "typed";
  c.format = serve::ModelFormat::kTorchScript;
  c.max_batch_size = max_batch_size;
  c.inputs = {{"INPUT__0", "FP32", {2}}, {"INPUT__1", "INT64", {3}}, {"INPUT__2", "BOOL", {2}}};
  c.outputs = {{"OUTPUT__0", "FP16", {2}}, {"OUTPUT__1", "INT64", {1}}, {"OUTPUT__2", "BOOL", {2}}};
  return c;
}

TEST(HttpProtocol, EachInputIsReadAsItsDatatypeInAnyOrderAndIntegersStayExact) {
  // 2^53 + 1 and INT64's extremes: a float or double on the way would change them.
  const auto r = serve::parse_infer_request(
      R"({"inputs":[{"name":"INPUT__2","shape":[2,2],"datatype":"BOOL","data":[[true,false],[false,true]]},)"
      R"({"name":"INPUT__1","shape":[2,3],"datatype":"INT64","data":[9007199254740993,-9223372036854775808,)"
      R"(9223372036854775807,0,1,2]},{"name":"INPUT__0","shape":[2,2],"datatype":"FP32","data":[0.5,1,2,3]}]})",
      std::nullopt, typed_config(4));
  ASSERT_EQ(r.inputs.size(), 3u);  // the config's order, whatever the request's
  EXPECT_TRUE(torch::equal(r.inputs[0], torch::tensor({{0.5f, 1.f}, {2.f, 3.f}})));
  EXPECT_EQ(r.inputs[1].scalar_type(), torch::kLong);
  EXPECT_EQ(r.inputs[1][0][0].item<int64_t>(), 9007199254740993);
  EXPECT_EQ(r.inputs[1][0][1].item<int64_t>(), INT64_MIN);
  EXPECT_EQ(r.inputs[1][0][2].item<int64_t>(), INT64_MAX);
  EXPECT_TRUE(torch::equal(r.inputs[2], torch::tensor({{true, false}, {false, true}})));
  ASSERT_EQ(r.outputs.size(), 3u);

  // The same as binary data, in the order the request lists the inputs; one byte per BOOL.
  const std::string header =
      R"({"inputs":[{"name":"INPUT__1","shape":[1,3],"datatype":"INT64","parameters":{"binary_data_size":24}},)"
      R"({"name":"INPUT__2","shape":[1,2],"datatype":"BOOL","parameters":{"binary_data_size":2}},)"
      R"({"name":"INPUT__0","shape":[1,2],"datatype":"FP32","data":[1,2]}],)"
      R"("outputs":[{"name":"OUTPUT__2"},{"name":"OUTPUT__0","parameters":{"binary_data":false}}],)"
      R"("parameters":{"binary_data_output":true}})";
  const int64_t indices[3] = {INT64_MAX, -5, 7};
  std::string body = header;
  body.append(reinterpret_cast<const char*>(indices), sizeof(indices));
  body.append("\x00\x01", 2);
  const auto b = serve::parse_infer_request(body, header.size(), typed_config(4));
  EXPECT_TRUE(torch::equal(b.inputs[1], torch::tensor({{INT64_MAX, int64_t{-5}, int64_t{7}}})));
  EXPECT_TRUE(torch::equal(b.inputs[2], torch::tensor({{false, true}})));
  // Only the outputs asked for, in that order; binary_data_output for those that do not say.
  ASSERT_EQ(b.outputs.size(), 2u);
  EXPECT_EQ(b.outputs[0].index, 2u);
  EXPECT_TRUE(b.outputs[0].binary);
  EXPECT_EQ(b.outputs[1].index, 0u);
  EXPECT_FALSE(b.outputs[1].binary);
}

TEST(HttpProtocol, ResponseWritesEachOutputAsItsDatatype) {
  serve::InferRequest request;
  request.outputs = {{1, false}, {2, false}, {0, false}};
  const serve::Tensors outputs{torch::tensor({{0.25f, -3.f}}).to(torch::kHalf),
                               torch::tensor({{int64_t{9007199254740993}}}), torch::tensor({{true, false}})};
  const auto j = nlohmann::json::parse(serve::make_infer_response(request, typed_config(4), 1, outputs).body);
  ASSERT_EQ(j["outputs"].size(), 3u);
  EXPECT_EQ(j["outputs"][0]["name"], "OUTPUT__1");
  EXPECT_EQ(j["outputs"][0]["datatype"], "INT64");
  EXPECT_EQ(j["outputs"][0]["data"][0].get<int64_t>(), 9007199254740993);
  EXPECT_EQ(j["outputs"][1]["data"], nlohmann::json({true, false}));
  EXPECT_EQ(j["outputs"][2]["datatype"], "FP16");
  EXPECT_EQ(j["outputs"][2]["data"], nlohmann::json({0.25, -3.0}));

  // Binary: each output's own bytes (2 per FP16), one after another in the order asked for.
  request.outputs = {{0, true}, {2, true}};
  const auto binary = serve::make_infer_response(request, typed_config(4), 1, outputs);
  ASSERT_TRUE(binary.header_length.has_value());
  const auto header = nlohmann::json::parse(binary.body.substr(0, *binary.header_length));
  EXPECT_EQ(header["outputs"][0]["parameters"]["binary_data_size"], 4);
  EXPECT_EQ(header["outputs"][1]["parameters"]["binary_data_size"], 2);
  ASSERT_EQ(binary.body.size(), *binary.header_length + 6);
  torch::Tensor half = torch::empty({2}, torch::kHalf);
  std::memcpy(half.data_ptr(), binary.body.data() + *binary.header_length, 4);
  EXPECT_TRUE(torch::equal(half, outputs[0][0]));
  EXPECT_EQ(binary.body.substr(*binary.header_length + 4), std::string("\x01\x00", 2));
}

TEST(HttpProtocol, ABadInputOfASeveralInputModelIsA400NamingItAndWhatTheModelTakes) {
  const std::string x0 = R"({"name":"INPUT__0","shape":[1,2],"datatype":"FP32","data":[1,2]})";
  const std::string x1 = R"({"name":"INPUT__1","shape":[1,3],"datatype":"INT64","data":[1,2,3]})";
  const std::string x2 = R"({"name":"INPUT__2","shape":[1,2],"datatype":"BOOL","data":[true,false]})";
  auto body = [](const std::string& inputs) { return "{\"inputs\":[" + inputs + "]}"; };
  struct Case {
    std::string body, message;
    int64_t max_batch_size = 4;
  };
  const std::vector<Case> cases{
      {body(x0 + "," + x1), "the request lacks input 'INPUT__2'; model 'typed' takes 'INPUT__0', 'INPUT__1', 'INPUT__2'"},
      {body(x0 + "," + x1 + "," + x0), "input 'INPUT__0' is given twice"},
      // more inputs than the model takes: refused by count before the DOM (each was read before)
      {body(x0 + "," + x1 + "," + x2 + "," + x0),
       "the request has 4 inputs; model 'typed' takes 3 ('INPUT__0', 'INPUT__1', 'INPUT__2'), each named once"},
      {body(x0 + "," + R"({"name":"INPUT__1","shape":[1,3],"datatype":"FP32","data":[1,2,3]})" + "," + x2),
       "input 'INPUT__1' has datatype \"FP32\"; model 'typed' takes INT64"},
      {body(x0 + "," + R"({"name":"INPUT__1","shape":[1,3],"datatype":"INT64","data":[1,2.5,3]})" + "," + x2),
       "input 'INPUT__1' data holds number 2.5; INT64 data is integers"},
      {body(x0 + "," + R"({"name":"INPUT__1","shape":[1,3],"datatype":"INT64","data":[1,2,18446744073709551615]})" +
            "," + x2),
       "INT64 data is integers (within INT64)"},
      {body(x0 + "," + x1 + "," + R"({"name":"INPUT__2","shape":[1,2],"datatype":"BOOL","data":[1,0]})"),
       "input 'INPUT__2' data holds number 1; BOOL data is true or false"},
      {body(x0 + "," + R"({"name":"INPUT__1","shape":[2,3],"datatype":"INT64","data":[1,2,3,4,5,6]})" + "," + x2),
       "input 'INPUT__1' has 2 samples but input 'INPUT__0' has 1"},
      {body(x0 + "," + x1 + "," + x2), "input 'INPUT__0' has shape [1, 2]; model 'typed' takes [2]", 0},
  };
  for (const Case& c : cases) {
    try {
      serve::parse_infer_request(c.body, std::nullopt, typed_config(c.max_batch_size));
      ADD_FAILURE() << "accepted: " << c.body;
    } catch (const serve::HttpError& e) {
      EXPECT_EQ(e.status(), 400) << c.body;
      EXPECT_THAT(e.what(), HasSubstr(c.message)) << c.body;
    }
  }
  serve::ModelConfig narrow = typed_config(4);
  narrow.inputs[0].datatype = "FP16";
  narrow.inputs[1].datatype = "INT32";
  const std::string half = R"({"name":"INPUT__0","shape":[1,2],"datatype":"FP16","data":[1,2]})";
  const std::string int32 = R"({"name":"INPUT__1","shape":[1,3],"datatype":"INT32","data":[1,2,3]})";
  const std::vector<std::pair<std::string, std::string>> ranges{
      {body(R"({"name":"INPUT__0","shape":[1,2],"datatype":"FP16","data":[1,70000]})" + std::string(",") + x2 + "," +
            int32),
       "input 'INPUT__0' value 1 is outside FP16's range (magnitude at most 65504)"},
      {body(half + "," + x2 + "," + R"({"name":"INPUT__1","shape":[1,3],"datatype":"INT32","data":[1,2,2147483648]})"),
       "input 'INPUT__1' value 2, 2147483648, is outside INT32's range"},
      {"{\"inputs\":[" + half + "," + x2 + "," + int32 + R"(],"outputs":[{"name":"OUTPUT__9"}]})",
       "unknown output \"OUTPUT__9\"; model 'typed' returns 'OUTPUT__0', 'OUTPUT__1', 'OUTPUT__2'"},
  };
  for (const auto& [text, message] : ranges) {
    try {
      serve::parse_infer_request(text, std::nullopt, narrow);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const serve::HttpError& e) {
      EXPECT_EQ(e.status(), 400) << text;
      EXPECT_THAT(e.what(), HasSubstr(message)) << text;
    }
  }
}

TEST(HttpProtocol, MetadataListsEveryTensorWithoutABatchDimensionWhenThereIsNone) {
  const auto batched = serve::model_metadata(typed_config(4), {1});
  EXPECT_EQ(batched["platform"], "pytorch_libtorch");
  ASSERT_EQ(batched["inputs"].size(), 3u);
  EXPECT_EQ(batched["inputs"][1], nlohmann::json({{"name", "INPUT__1"}, {"datatype", "INT64"}, {"shape", {-1, 3}}}));
  ASSERT_EQ(batched["outputs"].size(), 3u);
  EXPECT_EQ(batched["outputs"][2]["datatype"], "BOOL");
  const auto whole = serve::model_metadata(typed_config(0), {1});
  EXPECT_EQ(whole["inputs"][0]["shape"], nlohmann::json({2}));
  EXPECT_EQ(whole["outputs"][1]["shape"], nlohmann::json({1}));
}

TEST(HttpProtocol, MetadataGivesMinusOneForTheBatchDimension) {
  const auto j = serve::model_metadata(serve::default_model_config("convnet"), {1, 2});
  EXPECT_EQ(j["versions"], nlohmann::json({"1", "2"}));
  EXPECT_EQ(j["inputs"][0]["shape"], nlohmann::json({-1, 1, 28, 28}));
  EXPECT_EQ(j["outputs"][0]["shape"], nlohmann::json({-1, 10}));
  EXPECT_EQ(nlohmann::json::parse(serve::error_body("bad \xff byte"))["error"], "bad \xef\xbf\xbd byte");
}

}  // namespace
}  // namespace lockstep
