#include "lockstep/amp/opt_level.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <torch/torch.h>

#include "../dist/multi_rank.h"
#include "../test_util.h"
#include "lockstep/models/convnet.h"
#include "lockstep/models/mlp.h"
#include "lockstep/parallel/distributed_data_parallel.h"

namespace lockstep::amp {
namespace {

using ::testing::HasSubstr;
using lockstep::testing::error_message;
namespace F = torch::nn::functional;

struct Batch {
  torch::Tensor x, y;  // x (N, 1, 28, 28) fp32, y (N) class indices
};

Batch random_batch(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {torch::randn({n, 1, 28, 28}, gen), torch::randint(0, 10, {n}, gen, torch::kInt64)};
}

torch::optim::SGD sgd(torch::nn::Module& m, double lr = 0.05) {
  return torch::optim::SGD(m.parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
}

// One training step through the Amp object; returns the (unscaled, fp32) loss.
double train_step(Amp& amp, torch::nn::Module& model, const std::function<torch::Tensor(torch::Tensor)>& forward,
                  const Batch& b) {
  amp.zero_grad();
  torch::Tensor loss;
  {
    auto autocast = amp.autocast();
    loss = F::cross_entropy(amp.cast_output(forward(amp.cast_input(b.x))), b.y);
  }
  amp.scale_loss(loss).backward();
  amp.step();
  amp.update();
  return loss.item<double>();
}

struct Bytes {
  int64_t batch_norm = 0, other = 0;  // parameter bytes (numel * element size)
};

Bytes parameter_bytes(torch::nn::Module& model) {
  Bytes bytes;
  for (const auto& m : model.modules()) {
    const bool bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(m.get()) != nullptr;
    for (const auto& p : m->parameters(/*recurse=*/false))
      (bn ? bytes.batch_norm : bytes.other) += p.numel() * static_cast<int64_t>(p.element_size());
  }
  return bytes;
}

TEST(OptLevel, ParsesO0ToO3AndListsThemOnError) {
  EXPECT_EQ(parse_opt_level("O0"), OptLevel::kO0);
  EXPECT_EQ(parse_opt_level("O3"), OptLevel::kO3);
  EXPECT_EQ(to_string(OptLevel::kO2), "O2");
  EXPECT_THAT(error_message([] { parse_opt_level("o2"); }), HasSubstr("unknown opt level 'o2'; choose O0, O1, O2, O3"));
}

// The probe runs linear, conv2d and batch_norm in the precision: LibTorch 2.x's CPU kernels take
// fp16 (1.13's did not), so O2 in fp16 trains here; any other dtype is refused before the probe.
TEST(OptLevel, Fp16OnCpuPassesTheProbeAndTrainsAtO2) {
  EXPECT_EQ(error_message([] { check_precision_supported(torch::kCPU, torch::kHalf); }), "<no error>");
  EXPECT_EQ(error_message([] { check_precision_supported(torch::kCPU, torch::kBFloat16); }), "<no error>");
  EXPECT_THAT(error_message([] { check_precision_supported(torch::kCPU, torch::kFloat); }),
              HasSubstr("must be torch::kBFloat16 or torch::kHalf, got Float"));
  auto model = std::make_shared<models::ConvNetImpl>();
  auto opt = sgd(*model);
  Amp amp = initialize(*model, opt, OptLevel::kO2, AmpOptions().dtype(torch::kHalf));
  for (const auto& p : model->parameters())  // the convolutions' and the classifier's weights (BatchNorm's stay fp32)
    if (p.dim() > 1) EXPECT_EQ(p.scalar_type(), torch::kHalf);
  const double loss = train_step(amp, *model, [&](torch::Tensor x) { return model->forward(x); }, random_batch(8, 1));
  EXPECT_TRUE(std::isfinite(loss)) << loss;
}

TEST(OptLevel, O0ChangesNothingAndDoesNotScale) {
  auto model = std::make_shared<models::MLPImpl>();
  auto opt = sgd(*model);
  Amp amp = initialize(*model, opt, OptLevel::kO0);
  EXPECT_FALSE(amp.grad_scaler().is_enabled());
  EXPECT_EQ(model->fc1->weight.scalar_type(), torch::kFloat);
  auto autocast = amp.autocast();
  EXPECT_EQ(model->forward(amp.cast_input(torch::randn({2, 784}))).scalar_type(), torch::kFloat);
}

TEST(OptLevel, O1RunsActivationsInBf16UnderAutocastWithAnFp32Model) {
  auto model = std::make_shared<models::MLPImpl>();
  auto opt = sgd(*model);
  Amp amp = initialize(*model, opt, OptLevel::kO1);
  EXPECT_TRUE(amp.grad_scaler().is_enabled());
  EXPECT_EQ(model->fc1->weight.scalar_type(), torch::kFloat);
  const auto x = amp.cast_input(torch::randn({2, 784}));
  EXPECT_EQ(x.scalar_type(), torch::kFloat);
  {
    auto autocast = amp.autocast();
    EXPECT_EQ(model->forward(x).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(model->forward(x).scalar_type(), torch::kFloat);
}

// convnet: conv and fc parameters become bf16 (exactly half the bytes), BatchNorm's stay fp32.
TEST(OptLevel, O2HalvesParameterBytesExceptBatchNorm) {
  auto model = std::make_shared<models::ConvNetImpl>();
  const Bytes fp32 = parameter_bytes(*model);
  auto opt = sgd(*model);
  Amp amp = initialize(*model, opt, OptLevel::kO2);
  const Bytes o2 = parameter_bytes(*model);
  EXPECT_EQ(2 * o2.other, fp32.other);
  EXPECT_EQ(o2.batch_norm, fp32.batch_norm);
  EXPECT_GT(o2.batch_norm, 0);
  EXPECT_EQ(model->layer1[1]->buffers()[0].scalar_type(), torch::kFloat);  // running_mean
  EXPECT_EQ(model->named_buffers()["layer1.1.num_batches_tracked"].scalar_type(), torch::kLong);
  EXPECT_EQ(model->fc->weight.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(amp.grad_scaler().is_enabled());
}

// See Note [O2 master weights].
TEST(OptLevel, O2MastersAreFp32AndHalfWeightsEqualRoundedMastersAfterAStep) {
  auto model = std::make_shared<models::ConvNetImpl>();
  std::vector<torch::Tensor> initial;
  for (const auto& p : model->parameters()) initial.push_back(p.detach().clone());
  auto opt = sgd(*model);
  Amp amp = initialize(*model, opt, OptLevel::kO2);
  const auto params = model->parameters();
  const auto& masters = amp.master_params();
  ASSERT_EQ(masters.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(masters[i].scalar_type(), torch::kFloat) << i;
    EXPECT_TRUE(torch::equal(masters[i], initial[i])) << "masters start from the fp32 model, unrounded: " << i;
    EXPECT_TRUE(opt.param_groups()[0].params()[i].is_same(masters[i])) << "the optimizer steps the masters: " << i;
  }
  train_step(amp, *model, [&](torch::Tensor x) { return model->forward(x); }, random_batch(8, 1));
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_FALSE(torch::equal(masters[i], initial[i])) << "the step updated master " << i;
    EXPECT_TRUE(torch::equal(params[i], masters[i].to(params[i].scalar_type()))) << i;
  }
}

// zero_grad() zeroes in place; zero_grad(set_to_none) drops the masters' and the half model's
// gradients, as Python's optimizer.zero_grad(set_to_none=True) does.
TEST(OptLevel, O2ZeroGradZeroesOrDropsBothMasterAndHalfGradients) {
  auto model = std::make_shared<models::ConvNetImpl>();
  auto opt = sgd(*model);
  Amp amp = initialize(*model, opt, OptLevel::kO2);
  const auto params = model->parameters();
  train_step(amp, *model, [&](torch::Tensor x) { return model->forward(x); }, random_batch(8, 1));
  amp.zero_grad();
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined() && amp.master_params()[i].grad().defined()) << i;
    EXPECT_EQ(params[i].grad().abs().max().item<double>(), 0.0) << i;
    EXPECT_EQ(amp.master_params()[i].grad().abs().max().item<double>(), 0.0) << i;
  }
  amp.zero_grad(/*set_to_none=*/true);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_FALSE(params[i].grad().defined()) << i;
    EXPECT_FALSE(amp.master_params()[i].grad().defined()) << i;
  }
}

// After unscale_(), each master's gradient is its half parameter's gradient / scale, exactly
// (the scale is a power of 2), so clipping master_params() gradients clips the true ones.
TEST(OptLevel, O2UnscaleGivesMastersTheTrueGradients) {
  auto model = std::make_shared<models::ConvNetImpl>();
  auto opt = sgd(*model);
  Amp amp = initialize(*model, opt, OptLevel::kO2);
  const Batch b = random_batch(8, 2);
  amp.scale_loss(F::cross_entropy(amp.cast_output(model->forward(amp.cast_input(b.x))), b.y)).backward();
  amp.unscale_();
  const double scale = amp.grad_scaler().get_scale();
  const auto params = model->parameters();
  int64_t checked = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (amp.master_params()[i].is_same(params[i])) continue;  // BatchNorm: fp32, unscaled in place
    EXPECT_TRUE(torch::equal(amp.master_params()[i].grad(), params[i].grad().to(torch::kFloat) / scale)) << i;
    ++checked;
  }
  EXPECT_EQ(checked, 6);  // conv and fc weights and biases
  EXPECT_TRUE(amp.step());
}

TEST(OptLevel, O2SkipsTheStepOnInfAndLeavesModelAndMastersUnchanged) {
  auto model = std::make_shared<models::ConvNetImpl>();
  auto opt = sgd(*model);
  Amp amp = initialize(*model, opt, OptLevel::kO2);
  const Batch b = random_batch(8, 3);
  amp.scale_loss(F::cross_entropy(amp.cast_output(model->forward(amp.cast_input(b.x))), b.y)).backward();
  model->fc->bias.mutable_grad()[3] = std::numeric_limits<float>::infinity();
  std::vector<torch::Tensor> before;
  for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
  for (const auto& m : amp.master_params()) before.push_back(m.detach().clone());
  EXPECT_FALSE(amp.step());
  amp.update();
  std::vector<torch::Tensor> after = model->parameters();
  after.insert(after.end(), amp.master_params().begin(), amp.master_params().end());
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(torch::equal(after[i], before[i])) << i;
  EXPECT_EQ(amp.grad_scaler().get_scale(), 32768.0);
}

// 16 fixed images, 40 steps: memorising them must at least halve the loss (fp32 gets ~100x). At
// this learning rate O2's loss first climbs (to ~26 by the fourth step) and then falls by ~0.1 a
// step, so at 30 steps it sat at the threshold and rounding order alone (which BatchNorm kernels
// run) decided the test; at 40 it is ~0.13x the first on either.
TEST(OptLevel, O2TrainingDecreasesTheLoss) {
  torch::manual_seed(4);
  auto model = std::make_shared<models::ConvNetImpl>();
  auto opt = sgd(*model);
  Amp amp = initialize(*model, opt, OptLevel::kO2);
  const Batch b = random_batch(16, 4);
  auto forward = [&](torch::Tensor x) { return model->forward(x); };
  const double first = train_step(amp, *model, forward, b);
  double last = first;
  for (int step = 1; step < 40; ++step) last = train_step(amp, *model, forward, b);
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
}

TEST(OptLevel, O3ConvertsEverythingIncludingBatchNormWithoutMasters) {
  auto model = std::make_shared<models::ConvNetImpl>();
  const Bytes fp32 = parameter_bytes(*model);
  auto opt = sgd(*model);
  Amp amp = initialize(*model, opt, OptLevel::kO3);
  const Bytes o3 = parameter_bytes(*model);
  EXPECT_EQ(2 * o3.other, fp32.other);
  EXPECT_EQ(2 * o3.batch_norm, fp32.batch_norm);
  for (const auto& b : model->named_buffers())
    EXPECT_EQ(b.value().scalar_type(), b.key().find("num_batches_tracked") != std::string::npos ? torch::kLong : torch::kBFloat16)
        << b.key();
  EXPECT_FALSE(amp.grad_scaler().is_enabled());
  const auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(amp.master_params()[i].is_same(params[i]));
  const double loss = train_step(amp, *model, [&](torch::Tensor x) { return model->forward(x); }, random_batch(8, 5));
  EXPECT_TRUE(std::isfinite(loss));
}

TEST(OptLevel, O2NeedsAFreshOptimizerAndAnFp32Model) {
  auto model = std::make_shared<models::ConvNetImpl>();
  auto opt = sgd(*model);
  const Batch b = random_batch(4, 6);
  F::cross_entropy(model->forward(b.x), b.y).backward();
  opt.step();  // momentum buffers now exist
  EXPECT_THAT(error_message([&] { initialize(*model, opt, OptLevel::kO2); }),
              HasSubstr("needs an optimizer that has not stepped yet, but it holds state for 10 parameters"));
  auto fresh = sgd(*model);
  initialize(*model, fresh, OptLevel::kO2);
  auto again = sgd(*model);
  EXPECT_THAT(error_message([&] { initialize(*model, again, OptLevel::kO2); }),
              HasSubstr("expects an fp32 model, but 'layer1.0.weight' is BFloat16"));
}

// See Note [O2 master weights]: a weight written after initialize would be silently undone.
TEST(OptLevel, O2WeightsChangedAfterInitializeAreAnErrorNamingTheParameter) {
  auto model = std::make_shared<models::ConvNetImpl>();
  auto opt = sgd(*model);
  Amp amp = initialize(*model, opt, OptLevel::kO2);
  {
    torch::NoGradGuard no_grad;
    model->fc->weight.add_(1);
  }
  const Batch b = random_batch(4, 8);
  amp.scale_loss(F::cross_entropy(amp.cast_output(model->forward(amp.cast_input(b.x))), b.y)).backward();
  const std::string msg = error_message([&] { amp.step(); });
  EXPECT_THAT(msg, HasSubstr("parameter 'fc.weight' was changed after amp::initialize"));
  EXPECT_THAT(msg, HasSubstr("Load weights before initialize"));
}

// O2 under DDP, ranks starting from different weights: sync_module_states before initialize gives
// every rank rank 0's, bf16 gradients travel (Gloo all-gathers them), and the ranks' half
// parameters and masters stay bit-identical.
TEST(OptLevel, O2WithDdpKeepsRanksIdentical) {
  const Batch b = random_batch(16, 7);
  std::vector<std::vector<torch::Tensor>> finals(2);
  testing::run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    auto model = std::make_shared<models::ConvNetImpl>();
    auto opt = sgd(*model);
    parallel::sync_module_states(*model, group);
    Amp amp = initialize(*model, opt, OptLevel::kO2, AmpOptions().group(&group));
    parallel::DistributedDataParallel ddp(model, group, parallel::DistributedDataParallelOptions().init_sync(false));
    const Batch mine{b.x.narrow(0, rank * 8, 8), b.y.narrow(0, rank * 8, 8)};
    for (int step = 0; step < 3; ++step) train_step(amp, *model, [&](torch::Tensor x) { return ddp.forward(x); }, mine);
    for (const auto& p : model->parameters()) finals[rank].push_back(p.detach().clone());
    for (const auto& m : amp.master_params()) finals[rank].push_back(m.detach().clone());
  });
  for (size_t i = 0; i < finals[0].size(); ++i) EXPECT_TRUE(torch::equal(finals[0][i], finals[1][i])) << i;
}

}  // namespace
}  // namespace lockstep::amp
