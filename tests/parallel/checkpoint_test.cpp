#include "lockstep/parallel/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>

#include "lockstep/core/tensor_memory.h"
#include "lockstep/models/zoo.h"

namespace lockstep::parallel {
namespace {

namespace F = torch::nn::functional;

// The largest absolute difference between two lists of tensors of equal shapes.
double max_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    worst = std::max(worst, (a[i].to(torch::kDouble) - b[i].to(torch::kDouble)).abs().max().item<double>());
  return worst;
}

std::vector<torch::Tensor> gradients(const torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.grad());
  return out;
}

// One training step's gradients and buffers of a reference model, plainly or with every block
// checkpointed, from the same initial weights (seed 1) and batch.
struct StepResult {
  std::vector<torch::Tensor> grads, buffers;
  torch::Tensor loss;
};

StepResult train_step(const std::string& name, bool checkpointed, int64_t batch) {
  torch::manual_seed(1);
  auto model = models::make_model(name);
  if (checkpointed) model->set_block_runner(checkpoint_block);
  model->train();
  std::vector<int64_t> shape{batch};
  for (int64_t d : models::input_shape(name)) shape.push_back(d);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const torch::Tensor x = torch::randn(shape, gen), y = torch::randint(0, 10, {batch}, gen, torch::kInt64);
  torch::Tensor loss = F::cross_entropy(model->forward(x), y);
  loss.backward();
  return {gradients(*model), model->buffers(), loss.detach()};
}

class EveryModel : public ::testing::TestWithParam<std::string> {};

// Checkpointing every block changes what is kept, not what is computed: the gradients equal the
// plain model's (1e-6; the recompute runs the same kernels on the same inputs), and BatchNorm's
// running statistics and num_batches_tracked equal the plain model's exactly, i.e. they were
// updated once, not again in the recompute (see Note [Activation checkpointing]).
TEST_P(EveryModel, CheckpointedBlocksGiveThePlainGradientsAndUpdateBatchNormOnce) {
  const StepResult plain = train_step(GetParam(), false, 6);
  const StepResult checkpointed = train_step(GetParam(), true, 6);
  EXPECT_LE((plain.loss - checkpointed.loss).abs().item<double>(), 1e-6);
  for (const auto& g : checkpointed.grads) ASSERT_TRUE(g.defined()) << "a parameter got no gradient";
  EXPECT_LE(max_difference(plain.grads, checkpointed.grads), 1e-6);
  EXPECT_EQ(max_difference(plain.buffers, checkpointed.buffers), 0.0);
  for (const auto& b : checkpointed.buffers)
    if (b.scalar_type() == torch::kInt64) EXPECT_EQ(b.item<int64_t>(), 1) << "num_batches_tracked";
}

INSTANTIATE_TEST_SUITE_P(ReferenceModels, EveryModel, ::testing::Values("mlp", "convnet", "resnet18"));

// A block with dropout: Linear(20, 32), Dropout(0.5), ReLU, then Linear(32, 5) outside it.
struct DropoutNet {
  torch::nn::Sequential block{torch::nn::Linear(20, 32), torch::nn::Dropout(0.5), torch::nn::ReLU()};
  torch::nn::Linear head{32, 5};
  std::vector<torch::Tensor> parameters() const {
    auto p = block->parameters();
    for (const auto& t : head->parameters()) p.push_back(t);
    return p;
  }
};

// Gradients of the dropout net after one backward on fixed data; the generator is seeded with 3
// first. Also returns the generator's state after backward.
std::pair<std::vector<torch::Tensor>, torch::Tensor> dropout_step(bool checkpointed, CheckpointOptions options = {}) {
  torch::manual_seed(2);
  DropoutNet net;
  const torch::Tensor x = torch::randn({8, 20}), y = torch::randint(0, 5, {8}, torch::kInt64);
  torch::manual_seed(3);
  auto seq = net.block;
  auto run = [seq](const torch::Tensor& t) mutable { return seq->forward(t); };
  const torch::Tensor hidden = checkpointed ? checkpoint(*net.block, run, x, options) : run(x);
  F::cross_entropy(net.head->forward(hidden), y).backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : net.parameters()) grads.push_back(p.grad());
  return {grads, at::detail::getDefaultCPUGenerator().get_state()};
}

// The recompute draws the forward's dropout mask (the generator state is preserved), and leaves
// the generator where the plain run leaves it. Without preserve_rng_state the masks differ, and so
// do the gradients: the comparison can fail.
TEST(ActivationCheckpoint, DropoutRecomputesTheSameMaskAndLeavesTheGeneratorAsThePlainRun) {
  const auto [plain, plain_state] = dropout_step(false);
  const auto [checkpointed, checkpointed_state] = dropout_step(true);
  EXPECT_LE(max_difference(plain, checkpointed), 1e-6);
  EXPECT_TRUE(torch::equal(plain_state, checkpointed_state));
  const auto [unpreserved, unused] = dropout_step(true, CheckpointOptions().preserve_rng_state(false));
  EXPECT_GT(max_difference(plain, unpreserved), 1e-3);
}

// The function form with two inputs and a parameter, differentiated with torch::autograd::grad
// (not backward): the gradients flow through the graph like any op's, so nothing is accumulated
// in .grad behind autograd::grad's back.
TEST(ActivationCheckpoint, FunctionOfTensorsWorksWithAutogradGrad) {
  torch::manual_seed(4);
  const torch::Tensor a = torch::randn({5, 3}, torch::requires_grad());
  const torch::Tensor b = torch::randn({5, 3});  // no gradient wanted
  const torch::Tensor w = torch::randn({3, 4}, torch::requires_grad());
  auto f = [w](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{torch::tanh(in[0] * in[1]).matmul(w), in[0].sin()};
  };
  auto plain = f({a, b});
  auto expected = torch::autograd::grad({plain[0].sum() + plain[1].pow(2).sum()}, {a, w});
  auto out = checkpoint(f, {a, b}, {w});
  auto got = torch::autograd::grad({out[0].sum() + out[1].pow(2).sum()}, {a, w});
  EXPECT_LE(max_difference(expected, got), 1e-6);
  EXPECT_FALSE(w.grad().defined());
}

// Under NoGrad (evaluation) the segment just runs: the outputs need no graph.
TEST(ActivationCheckpoint, RunsPlainlyWithoutGrad) {
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::ones({2, 2}, torch::requires_grad());
  auto out = checkpoint([](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{in[0] * 2}; }, {x});
  EXPECT_FALSE(out[0].requires_grad());
  EXPECT_TRUE(torch::equal(out[0], torch::full({2, 2}, 2.0)));
}

struct StepMemory {
  int64_t held_for_backward = 0;  // bytes live after forward and loss: what the graph keeps
  int64_t peak = 0;               // the step's peak, backward included (recompute and gradients)
};

// Tensor bytes above the model's own during one ResNet-18 training step (forward, loss, backward)
// at batch 64, counted as Note [Counting tensor bytes] says. Cold: the model's first step, whose
// backward also allocates the parameter gradients (43 MiB); warm: a later step, the gradients
// allocated and zeroed before it as they are in training from the second step on.
StepMemory resnet18_step_memory(bool checkpointed, bool warm) {
  TensorMemoryCounter counting;
  torch::manual_seed(1);
  auto model = models::make_model("resnet18");
  if (checkpointed) model->set_block_runner(checkpoint_block);
  const torch::Tensor x = torch::randn({64, 3, 32, 32}), y = torch::randint(0, 10, {64}, torch::kInt64);
  if (warm) {
    F::cross_entropy(model->forward(x), y).backward();
    model->zero_grad(/*set_to_none=*/false);  // keeps the gradients' storage (2.x drops it by default)
  }
  TensorMemoryCounter::reset_peak();
  const int64_t start = TensorMemoryCounter::live_bytes();
  torch::Tensor loss = F::cross_entropy(model->forward(x), y);
  StepMemory m;
  m.held_for_backward = TensorMemoryCounter::live_bytes() - start;
  loss.backward();
  m.peak = TensorMemoryCounter::peak_bytes();
  return m;
}

// The peak of one plain forward and backward of ResNet-18's layer1.1 BasicBlock at batch 64 above
// its input (64 x 64 x 32 x 32): what a checkpointed backward adds while it recomputes that block
// (its activations, the incoming gradient and the gradients it makes).
int64_t layer1_block_peak() {
  TensorMemoryCounter counting;
  torch::manual_seed(1);
  auto model = models::make_model("resnet18");
  const models::Block block = model->blocks()[2];
  const torch::Tensor x = torch::randn({64, 64, 32, 32}).requires_grad_();
  TensorMemoryCounter::reset_peak();
  const torch::Tensor out = block.forward(x);
  out.backward(torch::ones_like(out));
  return TensorMemoryCounter::peak_bytes();
}

// Checkpointing each block of ResNet-18 (stem, 8 BasicBlocks, head) keeps ten block inputs
// instead of every activation. Measured at batch 64 (four steps, about 30 s of compute): what the
// graph holds after forward is 73% smaller (286.2 -> 76.1 MiB). The checkpointed step's peak comes
// while layer1.1 is recomputed: the parameter gradients (43 MiB, allocated in the first step's
// backward), the segment inputs not yet released (the image, layer1.0's and layer1.1's: 32.75 MiB)
// and that block's own forward and backward (144.1 MiB): 218.2 MiB, 31% below the plain first
// step's 316.6. In a warm step the gradients exist before it starts: 176.2 against 306.0 MiB, 42%
// lower. The thresholds leave room for allocation order only.
TEST(ActivationCheckpoint, ResNet18StepAtBatch64HoldsFarLessForBackwardAndPeaksLower) {
  const StepMemory plain = resnet18_step_memory(false, false), checkpointed = resnet18_step_memory(true, false);
  const StepMemory plain_warm = resnet18_step_memory(false, true), checkpointed_warm = resnet18_step_memory(true, true);
  const int64_t block = layer1_block_peak();
  const double mib = 1 << 20;
  const auto lower = [](int64_t a, int64_t b) { return 100.0 * (1.0 - static_cast<double>(b) / static_cast<double>(a)); };
  std::printf("ResNet-18 step at batch 64, tensor bytes above the model: held for backward plain %.1f MiB, "
              "checkpointed %.1f MiB (%.0f%% lower); first step's peak plain %.1f MiB, checkpointed %.1f MiB (%.0f%% "
              "lower); warm step's peak plain %.1f MiB, checkpointed %.1f MiB (%.0f%% lower); layer1.1 forward and "
              "backward alone %.1f MiB\n",
              plain.held_for_backward / mib, checkpointed.held_for_backward / mib,
              lower(plain.held_for_backward, checkpointed.held_for_backward), plain.peak / mib, checkpointed.peak / mib,
              lower(plain.peak, checkpointed.peak), plain_warm.peak / mib, checkpointed_warm.peak / mib,
              lower(plain_warm.peak, checkpointed_warm.peak), block / mib);
  EXPECT_GT(plain.held_for_backward, int64_t{200} << 20);  // the activations are there to be saved
  EXPECT_LE(static_cast<double>(checkpointed.held_for_backward), 0.4 * static_cast<double>(plain.held_for_backward));
  EXPECT_LE(static_cast<double>(checkpointed.peak), 0.75 * static_cast<double>(plain.peak));
  EXPECT_LE(static_cast<double>(checkpointed_warm.peak), 0.6 * static_cast<double>(plain_warm.peak));
}

}  // namespace
}  // namespace lockstep::parallel
