#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <limits>

#include "../test_util.h"
#include "lockstep/models/convnet.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/zoo.h"

namespace lockstep::models {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> keys(const torch::nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [k, v] : state_dict(m)) out.push_back(k);
  return out;
}

int64_t parameter_count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

// Keys and counts printed by Python for the modules in tests/python/reference_models.py.
TEST(Models, ConvNetHasPythonStateDictKeysInOrder) {
  ConvNet net;
  EXPECT_EQ(keys(*net), (std::vector<std::string>{
                            "layer1.0.weight", "layer1.0.bias", "layer1.1.weight", "layer1.1.bias",
                            "layer1.1.running_mean", "layer1.1.running_var",
                            "layer1.1.num_batches_tracked", "layer2.0.weight", "layer2.0.bias",
                            "layer2.1.weight", "layer2.1.bias", "layer2.1.running_mean",
                            "layer2.1.running_var", "layer2.1.num_batches_tracked", "fc.weight",
                            "fc.bias"}));
  EXPECT_EQ(parameter_count(*net), 29034);
}

// Without autograd the max-pools keep their output channels-last, and in eval mode each block is one
// oneDNN convolution with the BatchNorm folded in and one pass for ReLU and the pool (convnet.cpp):
// the logits are those of the autograd path, in eval and in train mode, and in eval mode again after
// a step has changed the weights (1e-6: the fold and the layers after a pool may round or sum in
// another order; relative to the largest logit after the step).
TEST(Models, ConvNetLogitsWithoutAutogradEqualThoseWithIt) {
  torch::manual_seed(4);
  ConvNet model;
  const torch::Tensor x = torch::randn({6, 1, 28, 28}, torch::requires_grad());
  for (const bool training : {false, true}) {
    model->train(training);
    const torch::Tensor with_autograd = model->forward(x);
    ASSERT_TRUE(with_autograd.requires_grad());
    torch::NoGradGuard no_grad;
    const torch::Tensor without = model->forward(x);
    EXPECT_LE((with_autograd - without).abs().max().item<double>(), 1e-6) << "training " << training;
  }
  // After a training step (new weights, new BatchNorm statistics) evaluation follows them.
  {
    model->train();
    torch::optim::SGD sgd(model->parameters(), 0.01);
    model->forward(x).sum().backward();
    sgd.step();
    model->eval();
    const torch::Tensor with_autograd = model->forward(x);
    torch::NoGradGuard no_grad;
    const torch::Tensor without = model->forward(x);
    const double largest = with_autograd.abs().max().item<double>();  // the step made the logits larger
    EXPECT_GT(largest, 1.0);
    EXPECT_LE((with_autograd - without).abs().max().item<double>() / largest, 1e-6) << "after a step";
  }
  // A NaN pixel reaches the logits of its own sample only, on both paths (ReLU and max keep NaNs).
  model->eval();
  torch::Tensor nan_input = x.detach().clone();
  nan_input[2][0][13][13] = std::numeric_limits<float>::quiet_NaN();
  const torch::Tensor with_autograd = model->forward(nan_input.requires_grad_());
  torch::NoGradGuard no_grad;
  const torch::Tensor without = model->forward(nan_input);
  EXPECT_TRUE(torch::equal(with_autograd.isnan(), without.isnan()));
  EXPECT_TRUE(without[2].isnan().all().item<bool>());
  EXPECT_FALSE(without[1].isnan().any().item<bool>());
}

TEST(Models, ZooBuildsEachModelWithPythonSizes) {
  struct Expect {
    std::string name;
    size_t keys;
    int64_t params;
  };
  for (const Expect& e : {Expect{"convnet", 16, 29034}, Expect{"mlp", 4, 203530}, Expect{"mlp-wide", 6, 7420938},
                          Expect{"resnet18", 122, 11173962}}) {
    auto model = make_model(e.name);
    EXPECT_EQ(state_dict(*model).size(), e.keys) << e.name;
    EXPECT_EQ(parameter_count(*model), e.params) << e.name;
    std::vector<int64_t> shape{2};
    for (int64_t d : input_shape(e.name)) shape.push_back(d);
    model->eval();
    EXPECT_EQ(model->forward(torch::zeros(shape)).sizes(), torch::IntArrayRef({2, 10})) << e.name;
  }
}

// Every norm layer comes from the factory (see Note [Norm layer factory]), with the same keys
// whatever it builds, and has_norm_layers says which models have any.
TEST(Models, NormLayersComeFromTheFactoryAndHasNormLayersKnowsWhichModelsHaveThem) {
  for (const auto& name : model_names()) {
    int64_t built = 0;
    auto counted = make_model(name, 10, [&built](int64_t channels) {
      ++built;
      return batch_norm_2d(channels);
    });
    int64_t batch_norms = 0;
    for (const auto& m : counted->modules()) batch_norms += m->as<torch::nn::BatchNorm2d>() != nullptr;
    EXPECT_EQ(built, batch_norms) << name;
    EXPECT_EQ(has_norm_layers(name), built > 0) << name;
    EXPECT_EQ(keys(*counted), keys(*make_model(name))) << name;
  }
}

TEST(Models, UnknownModelNamesTheValueAndTheChoices) {
  std::string msg = testing::error_message([] { make_model("vgg"); });
  EXPECT_THAT(msg, HasSubstr("'vgg'"));
  EXPECT_THAT(msg, HasSubstr("convnet, mlp, mlp-wide, resnet18"));
}

// Python reads what --save-model writes, loads it strictly into the equivalent module, and its
// eval-mode logits for a fixed input equal ours.
class PythonReadsStateDict : public ::testing::TestWithParam<std::string> {};

TEST_P(PythonReadsStateDict, TorchLoadAndStrictLoadStateDictGiveOurLogits) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  const std::string name = GetParam();
  torch::manual_seed(3);
  auto model = make_model(name);
  {  // Non-trivial running statistics, so buffers are checked too.
    torch::NoGradGuard no_grad;
    std::vector<int64_t> shape{8};
    for (int64_t d : input_shape(name)) shape.push_back(d);
    model->forward(torch::randn(shape) * 2 + 0.5);
  }
  model->eval();
  testing::TempDir dir;
  save_state_dict(*model, dir / "model.pt");

  auto r = testing::run_command(python + " " LOCKSTEP_SOURCE_DIR "/tests/python/reference_models.py " +
                                name + " " + (dir / "model.pt"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(testing::last_json_line(r.output));
  EXPECT_EQ(j["keys"].get<std::vector<std::string>>(), keys(*model));
  EXPECT_EQ(j["loaded_keys"].get<std::vector<std::string>>(), keys(*model));

  const auto shape = input_shape(name);
  const int64_t numel = 2 * shape[0] * shape[1] * shape[2];
  torch::Tensor x = torch::linspace(-1, 1, numel).reshape({2, shape[0], shape[1], shape[2]});
  torch::Tensor ours = model->forward(x).flatten();
  torch::Tensor theirs = torch::tensor(j["logits"].get<std::vector<float>>());
  ASSERT_EQ(theirs.numel(), ours.numel());
  EXPECT_LE((ours - theirs).abs().max().item<double>(), 1e-4) << "ours " << ours << " theirs " << theirs;
}

INSTANTIATE_TEST_SUITE_P(AllModels, PythonReadsStateDict,
                         ::testing::Values("convnet", "mlp", "mlp-wide", "resnet18"));

}  // namespace
}  // namespace lockstep::models
