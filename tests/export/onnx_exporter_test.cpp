// The exported graph itself: opset, dynamic batch, names, initializers, metadata, batch-norm
// folding, and the registry's errors and extension point.
#include "lockstep/export/onnx_exporter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "../test_util.h"
#include "lockstep/export/fold_batch_norm.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/zoo.h"

namespace lockstep::exporting {
namespace {

using ::testing::HasSubstr;

ExportOptions options_for(const std::string& name) {
  return ExportOptions().model_name(name).input_shape(models::input_shape(name));
}

int64_t count_ops(const onnx::GraphProto& g, const std::string& op) {
  int64_t n = 0;
  for (const auto& node : g.node()) n += node.op_type() == op;
  return n;
}

TEST(ExportGraph, HasOpset17ADynamicBatchNamedIoAndEveryWeightAsAnInitializer) {
  for (const auto& name : models::model_names()) {
    SCOPED_TRACE(name);
    auto model = models::make_model(name);
    const onnx::ModelProto proto = export_model(*model, options_for(name));
    ASSERT_EQ(proto.opset_import_size(), 1);
    EXPECT_EQ(proto.opset_import(0).version(), 17);
    EXPECT_EQ(proto.ir_version(), 8);
    const auto& g = proto.graph();
    ASSERT_EQ(g.input_size(), 1);
    EXPECT_EQ(g.input(0).name(), "input");
    const auto& in = g.input(0).type().tensor_type().shape();
    const auto want = models::input_shape(name);
    ASSERT_EQ(in.dim_size(), 4);
    EXPECT_EQ(in.dim(0).dim_param(), "batch");
    for (int i = 0; i < 3; ++i) EXPECT_EQ(in.dim(i + 1).dim_value(), want[i]);
    ASSERT_EQ(g.output_size(), 1);
    EXPECT_EQ(g.output(0).name(), "logits");
    const auto& out = g.output(0).type().tensor_type().shape();
    ASSERT_EQ(out.dim_size(), 2);
    EXPECT_EQ(out.dim(0).dim_param(), "batch");
    EXPECT_EQ(out.dim(1).dim_value(), 10);

    // Initializers are the state dict (less BatchNorm's step counter), value for value.
    std::map<std::string, torch::Tensor> expected;
    for (const auto& [key, t] : models::state_dict(*model))
      if (key.find("num_batches_tracked") == std::string::npos) expected.emplace(key, t);
    ASSERT_EQ(g.initializer_size(), static_cast<int>(expected.size()));
    for (const auto& init : g.initializer()) {
      ASSERT_TRUE(expected.count(init.name())) << init.name();
      EXPECT_EQ(init.data_type(), onnx::TensorProto::FLOAT) << init.name();
      EXPECT_TRUE(torch::equal(from_tensor_proto(init), expected.at(init.name()))) << init.name();
    }
    std::map<std::string, std::string> meta;
    for (const auto& p : proto.metadata_props()) meta[p.key()] = p.value();
    EXPECT_EQ(meta["model"], name);
    EXPECT_EQ(meta["lockstep_version"], "0.1.0");
    EXPECT_EQ(proto.producer_name(), "lockstep");
    EXPECT_THAT(proto.doc_string(), HasSubstr("logits float (batch, classes)"));
    for (const auto& node : g.node()) EXPECT_FALSE(node.doc_string().empty()) << node.name();
  }
}

TEST(ExportGraph, ConvnetPoolingIsAStandardMaxPoolAndResnetKeepsItsTwentyBatchNorms) {
  const auto convnet = export_model(*models::make_model("convnet"), options_for("convnet"));
  EXPECT_EQ(count_ops(convnet.graph(), "MaxPool"), 2);
  EXPECT_EQ(count_ops(convnet.graph(), "BatchNormalization"), 2);
  const auto resnet = export_model(*models::make_model("resnet18"), options_for("resnet18"));
  EXPECT_EQ(count_ops(resnet.graph(), "BatchNormalization"), 20);  // stem, 16 in blocks, 3 projections
  EXPECT_EQ(count_ops(resnet.graph(), "Conv"), 20);
  EXPECT_EQ(count_ops(resnet.graph(), "Add"), 8);
}

TEST(ExportGraph, FoldBnLeavesNoBatchNormalizationAndNoRunningStatistics) {
  for (const std::string name : {"convnet", "resnet18"}) {
    SCOPED_TRACE(name);
    const auto proto = export_model(*models::make_model(name), options_for(name).fold_batch_norm(true));
    EXPECT_EQ(count_ops(proto.graph(), "BatchNormalization"), 0);
    EXPECT_GT(count_ops(proto.graph(), "Conv"), 0);
    for (const auto& init : proto.graph().initializer())
      EXPECT_EQ(init.name().find("running_"), std::string::npos) << init.name();
  }
}

// The folding arithmetic against LibTorch's own Conv2d then BatchNorm2d, on a conv without bias (as
// in resnet18) and one with (convnet), with non-trivial statistics.
TEST(ExportGraph, FoldedConvComputesConvThenBatchNorm) {
  for (const bool bias : {false, true}) {
    torch::manual_seed(11);
    torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1).stride(2).bias(bias)),
                              torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(8).eps(1e-3)));
    {
      torch::NoGradGuard no_grad;
      auto* bn = net[1]->as<torch::nn::BatchNorm2d>();
      bn->running_mean.normal_(0, 0.5);
      bn->running_var.uniform_(0.2, 3.0);
      bn->weight.uniform_(0.5, 2.0);
      bn->bias.normal_(0, 0.5);
    }
    net->eval();
    auto proto = export_model(*net, ExportOptions().model_name("conv_bn").input_shape({3, 9, 9}).fold_batch_norm(true));
    ASSERT_EQ(proto.graph().node_size(), 1);
    const auto& conv = proto.graph().node(0);
    ASSERT_EQ(conv.op_type(), "Conv");
    ASSERT_EQ(conv.input_size(), 3);
    std::map<std::string, torch::Tensor> inits;
    for (const auto& init : proto.graph().initializer()) inits[init.name()] = from_tensor_proto(init);
    const torch::Tensor x = torch::randn({4, 3, 9, 9});
    torch::NoGradGuard no_grad;
    const torch::Tensor folded = torch::conv2d(x, inits.at(conv.input(1)), inits.at(conv.input(2)), 2, 1);
    EXPECT_LE((folded - net->forward(x)).abs().max().item<double>(), 1e-5) << "bias " << bias;
  }
}

// A layer type the registry does not know.
struct SwishImpl : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor& x) { return x * torch::sigmoid(x); }
};
TORCH_MODULE(Swish);

torch::nn::Sequential model_with_swish() {
  return torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(12, 5), Swish(), torch::nn::Linear(5, 3));
}

TEST(ExportGraph, AnUnknownLayerTypeIsAnErrorNamingTheTypeAndWhereItIs) {
  const auto net = model_with_swish();
  const std::string message = testing::error_message(
      [&] { export_model(*net, ExportOptions().model_name("swish").input_shape({3, 2, 2})); });
  EXPECT_THAT(message, HasSubstr("no ONNX emitter for layer type 'lockstep::exporting::(anonymous namespace)::SwishImpl'"));
  EXPECT_THAT(message, HasSubstr("cannot export '2'"));  // its state-dict path in the Sequential
  EXPECT_THAT(message, HasSubstr("EmitterRegistry::add"));
}

TEST(ExportGraph, AUsersEmitterTeachesTheExporterANewLayer) {
  const auto net = model_with_swish();
  EmitterRegistry registry = EmitterRegistry::with_builtins();
  registry.add<SwishImpl>([](const SwishImpl&, Scope& s, const std::string& x) {
    return s.op("Mul", {x, s.op("Sigmoid", {x})});
  });
  const auto proto = export_model(*net, ExportOptions().model_name("swish").input_shape({3, 2, 2}), registry);
  EXPECT_EQ(count_ops(proto.graph(), "Sigmoid"), 1);
  EXPECT_EQ(proto.graph().output(0).type().tensor_type().shape().dim(1).dim_value(), 3);
}

TEST(ExportGraph, TheCheckerRejectsAnInvalidGraphBeforeAnythingIsReturned) {
  auto net = model_with_swish();
  EmitterRegistry registry = EmitterRegistry::with_builtins();
  // Gemm of a 2-D input with a 1-D "weight": shape inference in strict mode must refuse it.
  registry.add<SwishImpl>([](const SwishImpl&, Scope& s, const std::string& x) {
    return s.op("Gemm", {x, s.initializer("bogus", torch::ones({7}))});
  });
  const std::string message = testing::error_message(
      [&] { export_model(*net, ExportOptions().model_name("broken").input_shape({3, 2, 2}), registry); });
  EXPECT_THAT(message, HasSubstr("fails the ONNX checker"));
}

TEST(ExportGraph, HalfPrecisionWeightsExportAsFloat32) {
  auto model = models::make_model("mlp");
  model->to(torch::kBFloat16);
  const auto proto = export_model(*model, options_for("mlp"));
  for (const auto& init : proto.graph().initializer()) EXPECT_EQ(init.data_type(), onnx::TensorProto::FLOAT) << init.name();
}

}  // namespace
}  // namespace lockstep::exporting
