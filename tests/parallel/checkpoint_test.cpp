#include "lockstep/parallel/checkpoint.h"

#include <c10/core/CPUAllocator.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <cstdio>

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

// Note [Measuring a step's memory]
// The peak of the bytes held in CPU tensors during a step, counted by an allocator that wraps
// LibTorch's CPU allocator (every tensor's storage comes from it): exact and free of what peak RSS
// also counts (the process's code, the data set, freed memory glibc keeps). oneDNN's own
// workspaces are not tensors and are not counted; they are the same with and without
// checkpointing.
// Raw-compatible (a DataPtr's context is its data, as oneDNN's raw_allocate requires): sizes are
// kept by address. One instance, made once and never destroyed, since tensors it made may outlive
// a test.
class CountingAllocator final : public c10::Allocator {
 public:
  static CountingAllocator& instance() {
    static CountingAllocator* counting = new CountingAllocator(c10::GetCPUAllocator());
    return *counting;
  }
  c10::DataPtr allocate(size_t n) const override {
    c10::DataPtr inner = inner_->allocate(n);
    TORCH_CHECK(inner.get() == inner.get_context(), "the CPU allocator is not raw-compatible");
    void* data = inner.release_context();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_[data] = static_cast<int64_t>(n);
      live_ += static_cast<int64_t>(n);
      peak_ = std::max(peak_, live_);
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  // Starts a measurement: the peak from now on, above what is live now.
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = base_ = live_;
  }
  int64_t peak_above_start() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_ - base_;
  }
  c10::Allocator* inner() const { return inner_; }
  int64_t live() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_;
  }

 private:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}
  static void release(void* data) {
    CountingAllocator& self = instance();
    {
      std::lock_guard<std::mutex> lock(self.mutex_);
      auto it = self.sizes_.find(data);
      if (it != self.sizes_.end()) {
        self.live_ -= it->second;
        self.sizes_.erase(it);
      }
    }
    self.inner_->raw_deleter()(data);
  }
  c10::Allocator* inner_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, int64_t> sizes_;
  mutable int64_t live_ = 0, peak_ = 0, base_ = 0;
};

// Installs the counting allocator while it lives.
class CountingScope {
 public:
  CountingScope() { c10::SetCPUAllocator(&CountingAllocator::instance()); }
  ~CountingScope() { c10::SetCPUAllocator(CountingAllocator::instance().inner()); }
};

struct StepMemory {
  int64_t held_for_backward = 0;  // bytes live after forward and loss: what the graph keeps
  int64_t peak = 0;               // the step's peak, backward included (recompute and gradients)
};

// Tensor bytes above the model's own during one ResNet-18 training step (forward, loss, backward)
// at batch 64; see Note [Measuring a step's memory].
StepMemory resnet18_step_memory(bool checkpointed) {
  CountingAllocator& counting = CountingAllocator::instance();
  CountingScope scope;
  torch::manual_seed(1);
  auto model = models::make_model("resnet18");
  if (checkpointed) model->set_block_runner(checkpoint_block);
  const torch::Tensor x = torch::randn({64, 3, 32, 32}), y = torch::randint(0, 10, {64}, torch::kInt64);
  counting.reset_peak();
  const int64_t start = counting.live();
  torch::Tensor loss = F::cross_entropy(model->forward(x), y);
  StepMemory m;
  m.held_for_backward = counting.live() - start;
  loss.backward();
  m.peak = counting.peak_above_start();
  return m;
}

// Checkpointing each block of ResNet-18 (stem, 8 BasicBlocks, head) keeps ten block inputs
// instead of every activation. Measured at batch 64 (about 15 s of compute): what the graph holds
// after forward is about 73% smaller; the whole step's peak, which also holds the parameter gradients
// (43 MiB) and one recomputed BasicBlock of layer1 (the largest, 64 x 64 x 32 x 32 per tensor)
// with its gradients, is about 30% lower. The thresholds leave room for allocation order only.
TEST(ActivationCheckpoint, ResNet18StepAtBatch64HoldsFarLessForBackwardAndPeaksLower) {
  const StepMemory plain = resnet18_step_memory(false);
  const StepMemory checkpointed = resnet18_step_memory(true);
  const double mib = 1 << 20;
  std::printf("ResNet-18 step at batch 64, tensor bytes above the model: held for backward plain %.1f MiB, "
              "checkpointed %.1f MiB (%.0f%% lower); step peak plain %.1f MiB, checkpointed %.1f MiB (%.0f%% lower)\n",
              plain.held_for_backward / mib, checkpointed.held_for_backward / mib,
              100.0 * (1.0 - static_cast<double>(checkpointed.held_for_backward) / static_cast<double>(plain.held_for_backward)),
              plain.peak / mib, checkpointed.peak / mib,
              100.0 * (1.0 - static_cast<double>(checkpointed.peak) / static_cast<double>(plain.peak)));
  EXPECT_GT(plain.held_for_backward, int64_t{200} << 20);  // the activations are there to be saved
  EXPECT_LE(static_cast<double>(checkpointed.held_for_backward), 0.4 * static_cast<double>(plain.held_for_backward));
  EXPECT_LE(static_cast<double>(checkpointed.peak), 0.75 * static_cast<double>(plain.peak));
}

}  // namespace
}  // namespace lockstep::parallel
