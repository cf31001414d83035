#include "lockstep/parallel/sync_batch_norm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <numeric>

#include "../dist/multi_rank.h"
#include "../test_util.h"
#include "lockstep/amp/opt_level.h"
#include "lockstep/models/convnet.h"
#include "lockstep/models/resnet.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/parallel/distributed_data_parallel.h"
#include "../../src/models/norm_relu_pool.h"

namespace lockstep::parallel {
namespace {

using ::testing::HasSubstr;
using lockstep::testing::run_ranks;
namespace nn = torch::nn;

constexpr double kTol = 1e-5;

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return a.numel() == 0 ? 0.0 : (a - b).abs().max().item<double>();
}

// What plain BatchNorm does in one process over the whole batch, step by step.
struct Reference {
  std::vector<torch::Tensor> y, grad_x, grad_weight, grad_bias;  // per step
  torch::Tensor running_mean, running_var, num_batches_tracked;  // after the last step
};

// Inputs and upstream gradients of `steps` steps: x (N, C, shape...), the loss is sum(y * g).
struct Batches {
  std::vector<torch::Tensor> x, g;
};

Batches make_batches(int64_t steps, int64_t n, int64_t channels, const std::vector<int64_t>& spatial) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  std::vector<int64_t> shape{n, channels};
  shape.insert(shape.end(), spatial.begin(), spatial.end());
  Batches b;
  for (int64_t s = 0; s < steps; ++s) {
    // Channel means well away from 0 and spreads unlike 1, so the statistics matter.
    b.x.push_back(torch::randn(shape, gen) * (1.5 + s) + 3.0);
    b.g.push_back(torch::randn(shape, gen));
  }
  return b;
}

// A BatchNorm's weight and bias made unlike their initial ones, the same on every call.
void set_affine(torch::Tensor weight, torch::Tensor bias) {
  torch::NoGradGuard no_grad;
  const int64_t c = weight.size(0);
  weight.copy_(torch::linspace(0.5, 1.5, c));
  bias.copy_(torch::linspace(-0.2, 0.3, c));
}

template <typename BatchNorm>
Reference plain_batch_norm(const Batches& b, const nn::BatchNormOptions& options) {
  BatchNorm bn(options);
  set_affine(bn->weight, bn->bias);
  Reference r;
  for (size_t s = 0; s < b.x.size(); ++s) {
    torch::Tensor x = b.x[s].clone().requires_grad_();
    bn->weight.mutable_grad() = torch::Tensor();
    bn->bias.mutable_grad() = torch::Tensor();
    torch::Tensor y = bn->forward(x);
    (y * b.g[s]).sum().backward();
    r.y.push_back(y.detach());
    r.grad_x.push_back(x.grad());
    r.grad_weight.push_back(bn->weight.grad().clone());
    r.grad_bias.push_back(bn->bias.grad().clone());
  }
  r.running_mean = bn->running_mean.clone();
  r.running_var = bn->running_var.clone();
  r.num_batches_tracked = bn->num_batches_tracked.clone();
  return r;
}

// Every rank holds `sizes[rank]` consecutive samples of each step's batch and runs SyncBatchNorm
// on them; the outputs and input gradients equal the reference's rows, the weight and bias
// gradients summed over ranks equal the reference's, the running statistics equal it and are
// identical on every rank.
template <typename BatchNorm, typename SyncBatchNorm>
void expect_equal_to_batch_norm_on_the_whole_batch(const std::vector<int64_t>& sizes, const std::vector<int64_t>& spatial,
                                                   const nn::BatchNormOptions& options,
                                                   at::MemoryFormat format = at::MemoryFormat::Contiguous) {
  const int64_t world = static_cast<int64_t>(sizes.size());
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  const Batches b = make_batches(3, total, options.num_features(), spatial);
  const Reference ref = plain_batch_norm<BatchNorm>(b, options);
  run_ranks(world, [&](int64_t rank, dist::ProcessGroup& pg) {
    const int64_t begin = std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t{0}), n = sizes[rank];
    SyncBatchNorm bn(options, pg);
    set_affine(bn->weight, bn->bias);
    const std::string where = "rank " + std::to_string(rank) + " of sizes " + c10::Join(",", sizes);
    for (size_t s = 0; s < b.x.size(); ++s) {
      torch::Tensor x = b.x[s].narrow(0, begin, n).contiguous(format).clone(format).requires_grad_();
      ASSERT_TRUE(x.is_contiguous(format)) << where;
      bn->weight.mutable_grad() = torch::Tensor();
      bn->bias.mutable_grad() = torch::Tensor();
      torch::Tensor y = bn->forward(x);
      (y * b.g[s].narrow(0, begin, n)).sum().backward();
      EXPECT_LE(max_diff(y, ref.y[s].narrow(0, begin, n)), kTol) << where << " step " << s;
      EXPECT_LE(max_diff(x.grad(), ref.grad_x[s].narrow(0, begin, n)), kTol) << where << " step " << s;
      torch::Tensor grads = torch::cat({bn->weight.grad(), bn->bias.grad()});
      pg.all_reduce(grads);  // as DDP sums them (then divides by the world size)
      EXPECT_LE(max_diff(grads, torch::cat({ref.grad_weight[s], ref.grad_bias[s]})), kTol) << where << " step " << s;
    }
    EXPECT_LE(max_diff(bn->running_mean, ref.running_mean), kTol) << where;
    EXPECT_LE(max_diff(bn->running_var, ref.running_var), kTol) << where;
    EXPECT_TRUE(torch::equal(bn->num_batches_tracked, ref.num_batches_tracked)) << where;
    const auto means = pg.all_gather(bn->running_mean), vars = pg.all_gather(bn->running_var);
    for (int64_t r = 1; r < world; ++r) {
      EXPECT_TRUE(torch::equal(means[r], means[0])) << where << ": running_mean differs on rank " << r;
      EXPECT_TRUE(torch::equal(vars[r], vars[0])) << where << ": running_var differs on rank " << r;
    }
  });
}

TEST(SyncBatchNorm, TwoRanksEqualBatchNormOnTheConcatenatedBatch) {
  expect_equal_to_batch_norm_on_the_whole_batch<nn::BatchNorm2d, SyncBatchNorm2d>({4, 4}, {5, 5},
                                                                                  nn::BatchNormOptions(3));
}

TEST(SyncBatchNorm, UnequalBatchesAndARankWithoutSamplesEqualBatchNormOnTheWholeBatch) {
  expect_equal_to_batch_norm_on_the_whole_batch<nn::BatchNorm2d, SyncBatchNorm2d>({6, 1}, {4, 3}, nn::BatchNormOptions(3));
  expect_equal_to_batch_norm_on_the_whole_batch<nn::BatchNorm2d, SyncBatchNorm2d>({0, 5}, {4, 3}, nn::BatchNormOptions(3));
  expect_equal_to_batch_norm_on_the_whole_batch<nn::BatchNorm2d, SyncBatchNorm2d>({3, 0, 4}, {2, 2}, nn::BatchNormOptions(2));
}

// The convnet's training blocks run BatchNorm, ReLU and the max-pool as one function, which takes a
// SyncBatchNorm too (src/models/norm_relu_pool.cpp): against BatchNorm2d, ReLU and MaxPool2d(2) on
// the whole batch over three steps, with unequal batches, and with a rank without samples that runs
// SyncBatchNorm's own forward instead, so the two paths' collectives must pair up.
TEST(SyncBatchNorm, InTheConvnetsOneFunctionTrainingPathEqualsTheModulesOnTheWholeBatch) {
  struct Split {
    std::vector<int64_t> sizes;
    bool last_rank_runs_the_module;
  };
  for (const Split& split : {Split{{3, 5}, false}, Split{{4, 0}, true}}) {
    const int64_t world = 2, total = split.sizes[0] + split.sizes[1], c = 6;
    const Batches b = make_batches(3, total, c, {8, 8});
    std::vector<torch::Tensor> g;  // the pooled outputs' gradients
    for (int s = 0; s < 3; ++s) g.push_back(torch::randn({total, c, 4, 4}));
    nn::BatchNorm2d plain(c);
    set_affine(plain->weight, plain->bias);
    Reference ref;
    for (size_t s = 0; s < b.x.size(); ++s) {
      torch::Tensor x = b.x[s].clone().requires_grad_();
      plain->zero_grad();
      torch::Tensor y = torch::max_pool2d(torch::relu(plain->forward(x)), {2, 2});
      (y * g[s]).sum().backward();
      ref.y.push_back(y.detach());
      ref.grad_x.push_back(x.grad());
      ref.grad_weight.push_back(plain->weight.grad().clone());
      ref.grad_bias.push_back(plain->bias.grad().clone());
    }
    run_ranks(world, [&](int64_t rank, dist::ProcessGroup& pg) {
      const int64_t begin = rank == 0 ? 0 : split.sizes[0], n = split.sizes[rank];
      SyncBatchNorm2d bn(nn::BatchNormOptions(c), pg);
      set_affine(bn->weight, bn->bias);
      const bool own_forward = split.last_rank_runs_the_module && rank == world - 1;
      const std::string where = "rank " + std::to_string(rank) + " of sizes " + c10::Join(",", split.sizes);
      for (size_t s = 0; s < b.x.size(); ++s) {
        torch::Tensor x = b.x[s].narrow(0, begin, n).clone().requires_grad_();
        ASSERT_TRUE(own_forward || models::norm_relu_pool_trains(*bn, x)) << where;
        bn->zero_grad();
        torch::Tensor y = own_forward ? torch::max_pool2d(torch::relu(bn->forward(x)), {2, 2})
                                      : models::norm_relu_pool_train(*bn, x);
        (y * g[s].narrow(0, begin, n)).sum().backward();
        EXPECT_LE(max_diff(y, ref.y[s].narrow(0, begin, n)), kTol) << where << " step " << s;
        EXPECT_LE(max_diff(x.grad(), ref.grad_x[s].narrow(0, begin, n)), kTol) << where << " step " << s;
        torch::Tensor grads = torch::cat({bn->weight.grad(), bn->bias.grad()});
        pg.all_reduce(grads);
        EXPECT_LE(max_diff(grads, torch::cat({ref.grad_weight[s], ref.grad_bias[s]})), kTol) << where << " step " << s;
      }
      EXPECT_LE(max_diff(bn->running_mean, plain->running_mean), kTol) << where;
      EXPECT_LE(max_diff(bn->running_var, plain->running_var), kTol) << where;
      EXPECT_TRUE(torch::equal(bn->num_batches_tracked, plain->num_batches_tracked)) << where;
    });
  }
}

// Inputs laid out channels-last (convnet's and resnet18's activations): statistics are summed over
// rows of C, not blocks of H x W.
TEST(SyncBatchNorm, ChannelsLastInputsEqualBatchNormOnTheWholeBatch) {
  expect_equal_to_batch_norm_on_the_whole_batch<nn::BatchNorm2d, SyncBatchNorm2d>(
      {4, 3}, {5, 6}, nn::BatchNormOptions(7), at::MemoryFormat::ChannelsLast);
  expect_equal_to_batch_norm_on_the_whole_batch<nn::BatchNorm3d, SyncBatchNorm3d>(
      {2, 0, 3}, {2, 3, 2}, nn::BatchNormOptions(3), at::MemoryFormat::ChannelsLast3d);
}

// (N, C) and (N, C, L) for 1d, (N, C, D, H, W) for 3d; momentum None is the cumulative average,
// and a layer without affine parameters has only the input gradient.
TEST(SyncBatchNorm, OneAndThreeDimensionsAndMomentumNoneMatchBatchNorm) {
  expect_equal_to_batch_norm_on_the_whole_batch<nn::BatchNorm1d, SyncBatchNorm1d>({5, 3}, {}, nn::BatchNormOptions(4));
  expect_equal_to_batch_norm_on_the_whole_batch<nn::BatchNorm1d, SyncBatchNorm1d>(
      {2, 3}, {6}, nn::BatchNormOptions(4).momentum(c10::nullopt));
  expect_equal_to_batch_norm_on_the_whole_batch<nn::BatchNorm3d, SyncBatchNorm3d>({2, 1}, {3, 2, 2},
                                                                                  nn::BatchNormOptions(2).momentum(0.3));
}

// Eval mode uses the running statistics and talks to nobody: rank 0 runs alone (a collective
// would time out after 1.5 s) and matches BatchNorm's eval output exactly.
TEST(SyncBatchNorm, EvalUsesRunningStatisticsWithoutCommunication) {
  run_ranks(2, [](int64_t rank, dist::ProcessGroup& pg) {
    if (rank != 0) return;
    SyncBatchNorm2d sync(nn::BatchNormOptions(3), pg);
    nn::BatchNorm2d plain(nn::BatchNormOptions(3));
    for (nn::BatchNorm2dImpl* bn : {static_cast<nn::BatchNorm2dImpl*>(sync.get()), plain.get()}) {
      torch::NoGradGuard no_grad;
      bn->running_mean.copy_(torch::tensor({1.0f, -2.0f, 0.5f}));
      bn->running_var.copy_(torch::tensor({4.0f, 0.25f, 1.0f}));
      bn->eval();
    }
    const torch::Tensor x = torch::randn({2, 3, 4, 4});
    EXPECT_TRUE(torch::equal(sync->forward(x), plain->forward(x)));
  }, std::chrono::milliseconds(1500));
}

TEST(SyncBatchNorm, OneValuePerChannelInTheGlobalBatchIsRejectedOnEveryRank) {
  run_ranks(2, [](int64_t rank, dist::ProcessGroup& pg) {
    SyncBatchNorm1d bn(nn::BatchNormOptions(3), pg);
    auto msg = testing::error_message([&] { bn->forward(torch::ones({rank == 0 ? 1 : 0, 3})); });
    EXPECT_THAT(msg, HasSubstr("SyncBatchNorm on rank " + std::to_string(rank) + " of 2: the global batch has 1 value(s) "
                               "per channel (this rank " + std::to_string(1 - rank)));
  });
}

// convert_sync_batchnorm keeps every value and key and converts layers inside Sequentials; a
// BatchNorm held by a model's own member is refused before anything changes.
TEST(SyncBatchNorm, ConvertKeepsStateAndRefusesLayersItCannotReach) {
  run_ranks(1, [](int64_t, dist::ProcessGroup& pg) {
    torch::manual_seed(0);
    auto convnet = std::make_shared<models::ConvNetImpl>();
    convnet->layer1->ptr(1)->as<nn::BatchNorm2d>()->running_mean.fill_(0.25);
    const auto before = models::state_dict(*convnet);
    auto converted = convert_sync_batchnorm(convnet, pg);
    EXPECT_EQ(converted.get(), convnet.get());
    const auto after = models::state_dict(*convnet);
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < after.size(); ++i) {
      EXPECT_EQ(after[i].first, before[i].first);
      EXPECT_TRUE(torch::equal(after[i].second, before[i].second)) << after[i].first;
    }
    int64_t sync_layers = 0;
    for (const auto& m : convnet->modules()) sync_layers += is_sync_batch_norm(*m);
    EXPECT_EQ(sync_layers, 2);
    EXPECT_TRUE(is_sync_batch_norm(*convnet->layer1->ptr(1)));
    EXPECT_TRUE(is_sync_batch_norm(*convnet->layer2->named_children()[1].value()));

    auto bn = convert_sync_batchnorm(nn::BatchNorm1d(5).ptr(), pg);
    EXPECT_TRUE(is_sync_batch_norm(*bn));

    auto resnet = std::make_shared<models::ResNet18Impl>();
    auto msg = testing::error_message([&] { convert_sync_batchnorm(resnet, pg); });
    EXPECT_THAT(msg, HasSubstr("'bn1' (torch::nn::BatchNorm2dImpl) is held by 'the model'"));
    EXPECT_THAT(msg, HasSubstr("parallel::sync_batch_norm_layer(group)"));
    for (const auto& m : resnet->modules()) EXPECT_FALSE(is_sync_batch_norm(*m)) << "converted after all";
  });
}

// Built through the norm layer factory, the models hold SyncBatchNorm, and amp's O2 keeps it in
// fp32 as it keeps BatchNorm, while the convolutions become bf16; a bf16 training step runs.
TEST(SyncBatchNorm, O2KeepsSyncBatchNormInFp32) {
  run_ranks(2, [](int64_t rank, dist::ProcessGroup& pg) {
    auto model = std::make_shared<models::ResNet18Impl>(10, sync_batch_norm_layer(pg));
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    amp::Amp a = amp::initialize(*model, sgd, amp::OptLevel::kO2);
    int64_t sync_layers = 0;
    for (const auto& m : model->modules()) {
      if (!is_sync_batch_norm(*m)) continue;
      ++sync_layers;
      for (const auto& p : m->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat);
      for (const auto& b : m->buffers()) EXPECT_NE(b.scalar_type(), torch::kBFloat16);
    }
    EXPECT_EQ(sync_layers, 20);
    EXPECT_EQ(model->conv1->weight.scalar_type(), torch::kBFloat16);
    torch::Tensor out = model->forward(a.cast_input(torch::randn({rank + 1, 3, 32, 32})));
    EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
    out.to(torch::kFloat).sum().backward();
    EXPECT_TRUE(model->bn1.ptr()->parameters()[0].grad().defined());
  });
}

struct TwoNormsImpl : nn::Module {
  explicit TwoNormsImpl(dist::ProcessGroup& pg)
      : plain(register_module("plain", nn::BatchNorm1d(3))),
        sync(register_module("sync", SyncBatchNorm1d(nn::BatchNormOptions(3), pg))) {}
  torch::Tensor forward(const torch::Tensor& x) { return sync->forward(plain->forward(x)); }
  nn::BatchNorm1d plain;
  SyncBatchNorm1d sync;
};

// DDP broadcasts rank 0's plain BatchNorm buffers before each forward but leaves SyncBatchNorm's,
// which are equal on every rank already: a difference planted there on rank 1 survives.
TEST(SyncBatchNorm, DistributedDataParallelDoesNotBroadcastItsBuffers) {
  run_ranks(2, [](int64_t rank, dist::ProcessGroup& pg) {
    auto model = std::make_shared<TwoNormsImpl>(pg);
    DistributedDataParallel ddp(model, pg);
    auto& plain = model->plain;
    auto& sync = model->sync;
    if (rank == 1) {
      plain->running_mean.fill_(5);
      sync->running_mean.fill_(5);
    }
    ddp.forward(torch::ones({4, 3}));  // the same batch on both ranks
    const auto plain_means = pg.all_gather(plain->running_mean), sync_means = pg.all_gather(sync->running_mean);
    EXPECT_TRUE(torch::equal(plain_means[0], plain_means[1]));
    EXPECT_LE(max_diff(sync_means[1] - sync_means[0], torch::full({3}, 4.5f)), 1e-6);  // 5 x (1 - momentum 0.1)
  });
}

}  // namespace
}  // namespace lockstep::parallel
