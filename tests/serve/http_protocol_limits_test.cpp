// KServe v2 infer requests sized against the model before they are read: more inputs than the
// model takes are refused by their count, before a JSON DOM of them is built (see
// parse_infer_request), and the count is the DOM's, whatever the strings and arrays hold.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../test_util.h"
#include "lockstep/serve/http_protocol.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;

serve::ModelConfig one_input_config() {
  serve::ModelConfig c = serve::default_model_config("convnet");
  c.inputs[0].dims = {1, 2, 2};
  c.max_batch_size = 4;
  return c;
}

std::string refusal(const std::string& body) {
  try {
    serve::parse_infer_request(body, std::nullopt, one_input_config());
  } catch (const serve::HttpError& e) {
    return std::to_string(e.status()) + " " + e.what();
  }
  return "accepted";
}

// 10^5 copies of the input (6 MB): before, a DOM of all of them was built (10^6: 0.9 GB, 4 s)
// and the second was then "given twice".
TEST(HttpProtocolLimits, MoreInputsThanTheModelTakesAreRefusedByTheirCount) {
  const std::string input = R"({"name":"input","shape":[1,1,2,2],"datatype":"FP32","data":[1,2,3,4]})";
  std::string body = "{\"inputs\":[" + input;
  for (int i = 1; i < 100000; ++i) body += "," + input;
  body += "]}";
  EXPECT_EQ(refusal(body), "400 the request has 100000 inputs; model 'convnet' takes 1 ('input'), each named once");
  EXPECT_THAT(refusal("{\"inputs\":[" + input + "," + input + "]}"), HasSubstr("takes 1 ('input')"));
  // A body cut short or mis-nested is reported as malformed, however many entries it starts with.
  EXPECT_THAT(refusal("{\"inputs\":[" + input + "," + input + "," + input), HasSubstr("400 malformed JSON"));
  EXPECT_THAT(refusal("{\"inputs\":[" + input + "," + input + "}]"), HasSubstr("400 malformed JSON"));
  EXPECT_THAT(refusal("{\"inputs\":[" + input + "," + input + "]}\"x"), HasSubstr("400 malformed JSON"));
}

TEST(HttpProtocolLimits, OnlyTheEntriesOfTheTopLevelInputsArrayCount) {
  const std::vector<std::string> accepted{
      // commas and brackets in strings, shapes, nested data, parameters and outputs
      R"({"id":"a,b,[c],{d}","inputs":[{"name":"input","shape":[1,1,2,2],"datatype":"FP32",)"
      R"("data":[[[[1,2],[3,4]]]]}],"outputs":[{"name":"logits"}],"parameters":{"binary_data_output":false}})",
      // a repeated key: the DOM keeps the last "inputs", and so does the count
      R"({"inputs":[{},{},{}],"inputs":[{"name":"input","shape":[1,1,2,2],"datatype":"FP32","data":[1,2,3,4]}]})",
  };
  for (const std::string& body : accepted) EXPECT_EQ(refusal(body), "accepted") << body;
  EXPECT_THAT(refusal(R"({"inputs":[{"name":"input","shape":[1,1,2,2],"datatype":"FP32","data":[1,2,3,4]}],)"
                      R"("inputs":[1,2]})"),
              HasSubstr("the request has 2 inputs"));
}

}  // namespace
}  // namespace lockstep
