// A model scripted in Python trains in C++ as any torch::nn::Module (Note [TorchScript modules as
// nn::Modules]): Python's parameter names, Python's outputs, optimizer steps that reach the script,
// and DDP on two ranks that equals one process, as for lockstep's own models.
#include "lockstep/models/torchscript_module.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../dist/multi_rank.h"
#include "../test_util.h"
#include "lockstep/amp/autocast.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/ddp_strategy.h"
#include "lockstep/parallel/local_strategy.h"

namespace lockstep::models {
namespace {

using ::testing::HasSubstr;

// tests/python/torchscript_models.py's residual MLP (16 inputs, 4 outputs), and what Python made of it.
struct PythonModel {
  std::string file;
  nlohmann::json io;
};

PythonModel python_model(const testing::TempDir& dir) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) return {};
  const auto made = testing::run_command(python + " " + std::string(LOCKSTEP_SOURCE_DIR) +
                                         "/tests/python/torchscript_models.py " + dir.path());
  EXPECT_EQ(made.exit_code, 0) << made.output;
  return {dir / "residual_mlp.pt", nlohmann::json::parse(testing::read_text(dir / "residual_mlp_io.json"))};
}

torch::Tensor matrix(const nlohmann::json& rows) {
  std::vector<torch::Tensor> out;
  for (const auto& row : rows) out.push_back(torch::tensor(row.get<std::vector<float>>()));
  return torch::stack(out);
}

TEST(TorchScriptModule, HasPythonsNamesAndOutputsAndAnOptimizerStepReachesTheScript) {
  testing::TempDir dir;
  const PythonModel py = python_model(dir);
  if (py.file.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  TorchScriptModule model(py.file);
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) names.push_back(item.key());
  for (const auto& item : model->named_buffers()) names.push_back(item.key());
  std::vector<std::string> python_names = py.io["state_dict_keys"];
  std::sort(names.begin(), names.end());
  std::sort(python_names.begin(), python_names.end());
  EXPECT_EQ(names, python_names);

  model->eval();
  const torch::Tensor x = matrix(py.io["input"]);
  const double difference = (model->forward(x) - matrix(py.io["output"])).abs().max().item<double>();
  std::cout << "[ measured ] C++ forward against Python's module(x): max |difference| " << difference << "\n";
  EXPECT_LT(difference, 1e-6);

  model->train();
  auto optimizer = optim::make_optimizer(model->parameters(), optim::OptimizerOptions(optim::OptimizerKind::kSGD, 0.1));
  torch::nn::functional::cross_entropy(model->forward(x), torch::tensor({0, 1, 2, 3, 0})).backward();
  optimizer->step();
  const torch::Tensor head = model->script().attr("head").toModule().attr("weight").toTensor();
  EXPECT_TRUE(torch::equal(head, model->named_parameters()["head.weight"]));
  EXPECT_EQ(head.data_ptr(), model->named_parameters()["head.weight"].data_ptr());
  EXPECT_GT((model->forward(x) - matrix(py.io["output"])).abs().max().item<double>(), 1e-3);  // it moved
}

// As DdpStrategy's own test: two ranks of 12 samples equal one process accumulating the two halves
// bit for bit (the same sums in the same order), whatever the script computes.
TEST(TorchScriptModule, DdpOfTwoRanksEqualsOneProcessAccumulatingBothHalves) {
  testing::TempDir dir;
  const PythonModel py = python_model(dir);
  if (py.file.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const torch::Tensor x = torch::randn({96, 16}, gen), y = torch::randint(0, 4, {96}, gen, torch::kInt64);
  const auto loss = [](const torch::Tensor& out, const torch::Tensor& t) {
    return torch::nn::functional::cross_entropy(out, t);
  };
  const auto options = [] {
    const auto o = optim::OptimizerOptions(optim::OptimizerKind::kSGD, 0.1).momentum(0.9);
    return parallel::StrategyOptions().optimizer(
        [o](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), o); });
  };
  TorchScriptModule local_model(py.file);
  parallel::LocalStrategy local(torch::nn::AnyModule(local_model), options());
  for (int64_t k = 0; k < 4; ++k) {
    local.forward_backward({{x.narrow(0, 24 * k, 12), y.narrow(0, 24 * k, 12), 0.5},
                            {x.narrow(0, 24 * k + 12, 12), y.narrow(0, 24 * k + 12, 12), 0.5}},
                           loss);
    ASSERT_TRUE(local.step().stepped);
  }
  std::vector<std::vector<torch::Tensor>> finals(2);
  testing::run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    TorchScriptModule model(py.file);
    parallel::DdpStrategy ddp(torch::nn::AnyModule(model), options().group(std::shared_ptr<dist::ProcessGroup>(&group, [](dist::ProcessGroup*) {})));
    for (int64_t k = 0; k < 4; ++k) {
      ddp.forward_backward({{x.narrow(0, 24 * k + 12 * rank, 12), y.narrow(0, 24 * k + 12 * rank, 12), 1.0}}, loss);
      ASSERT_TRUE(ddp.step().stepped);
    }
    for (const auto& p : model->parameters()) finals[rank].push_back(p.detach().clone());
  });
  const auto exact = local_model->parameters();
  ASSERT_EQ(finals[0].size(), exact.size());
  for (size_t i = 0; i < exact.size(); ++i) {
    EXPECT_TRUE(torch::equal(finals[0][i], finals[1][i])) << "ranks differ at parameter " << i;
    EXPECT_TRUE(torch::equal(finals[0][i], exact[i]))
        << "parameter " << i << ": max difference " << (finals[0][i] - exact[i]).abs().max().item<double>();
  }
}

std::vector<std::string> block_names(TorchScriptModuleImpl& model) {
  std::vector<std::string> names;
  for (const auto& block : model.blocks()) names.push_back(block.name);
  return names;
}

// See Note [Blocks of a TorchScript module]: the children a forward calls in order, a Sequential
// inside opened, parameter-less ones (Flatten) joined to their neighbour; scripted or traced, the
// blocks run in order compute the forward, and through a block runner forward() runs them.
TEST(TorchScriptModule, ChildrenCalledInOrderAreTheBlocksAndComputeTheForward) {
  testing::TempDir dir;
  if (python_model(dir).file.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const torch::Tensor x = torch::randn({4, 1, 28, 28}, gen);
  for (const std::string file : {"image_mlp.pt", "image_mlp_traced.pt"}) {
    TorchScriptModule model(dir / file);
    EXPECT_THAT(block_names(*model), ::testing::ElementsAre("embed", "blocks.0", "blocks.1", "head")) << file;
    torch::Tensor y = x;
    for (const auto& block : model->blocks()) y = block.forward(y);
    const torch::Tensor expected = model->forward(x);
    EXPECT_TRUE(torch::allclose(y, expected, 1e-6, 1e-6)) << file;
    EXPECT_EQ(block_parameters(model->blocks()[0]).size(), 2u) << file;  // embed's; Flatten has none
    int64_t runs = 0;
    model->set_block_runner([&runs](const Block& block, const torch::Tensor& in) { ++runs; return block.forward(in); });
    EXPECT_TRUE(torch::allclose(model->forward(x), expected, 1e-6, 1e-6)) << file;
    EXPECT_EQ(runs, 4) << file;
  }
  TorchScriptModule cnn(dir / "cnn.pt");
  const std::string error = testing::error_message([&] { cnn->blocks(); });
  EXPECT_THAT(error, HasSubstr("'" + (dir / "cnn.pt") + "': fsdp, pipeline stages and activation checkpointing"));
  EXPECT_THAT(error, HasSubstr("its forward runs aten::flatten (")) << error;
}

// Autocast reaches the ops the script calls: its linear layers run in bf16, as in Python.
TEST(TorchScriptModule, AutocastAppliesToTheOpsTheScriptCalls) {
  testing::TempDir dir;
  const PythonModel py = python_model(dir);
  if (py.file.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  TorchScriptModule model(py.file);
  const torch::Tensor x = matrix(py.io["input"]);
  EXPECT_EQ(model->forward(x).scalar_type(), torch::kFloat);
  amp::AutocastGuard autocast;
  const torch::Tensor half = model->forward(x);
  EXPECT_EQ(half.scalar_type(), torch::kBFloat16);
  EXPECT_LT((half.to(torch::kFloat) - matrix(py.io["output"])).abs().max().item<double>(), 0.1);
}

TEST(TorchScriptModule, AFileThatIsNotTorchScriptIsNamed) {
  testing::TempDir dir;
  std::ofstream(dir / "state_dict.pt") << "not a zip archive";
  EXPECT_THAT(testing::error_message([&] { TorchScriptModule m(dir / "state_dict.pt"); }),
              HasSubstr("'" + (dir / "state_dict.pt") + "' is not a TorchScript module (torch.jit.save"));
  torch::save(torch::zeros({2}), dir / "tensors.pt");
  EXPECT_THAT(testing::error_message([&] { TorchScriptModule m(dir / "tensors.pt"); }),
              HasSubstr("holds TorchScript without a forward method"));
}

}  // namespace
}  // namespace lockstep::models
