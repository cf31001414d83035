#include "lockstep/parallel/distributed_data_parallel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../dist/multi_rank.h"
#include "../test_util.h"
#include "lockstep/models/convnet.h"
#include "lockstep/models/mlp.h"

namespace lockstep::parallel {
namespace {

using ::testing::HasSubstr;
using lockstep::testing::run_ranks;
namespace F = torch::nn::functional;

constexpr double kTol = 1e-5;  // fp32 sums in a different order

// Copies `from`'s parameters and buffers into `to` (same architecture).
void copy_state(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto src = from.parameters(), dst = to.parameters();
  for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  auto sb = from.buffers(), db = to.buffers();
  for (size_t i = 0; i < sb.size(); ++i) db[i].copy_(sb[i]);
}

double max_abs_diff(const torch::nn::Module& a, const torch::nn::Module& b) {
  double worst = 0;
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>());
  return worst;
}

struct Data {
  torch::Tensor x, y;  // x (N, 1, 28, 28), y (N)
};

Data random_data(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {torch::randn({n, 1, 28, 28}, gen), torch::randint(0, 10, {n}, gen, torch::kInt64)};
}

torch::optim::SGD sgd(torch::nn::Module& m) {
  return torch::optim::SGD(m.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
}

// The single-process reference: a copy of `initial` after `steps` SGD steps of `batch` samples each,
// taken in order from `d`.
std::shared_ptr<models::MLPImpl> train_reference(const models::MLPImpl& initial, const Data& d,
                                                 int64_t steps, int64_t batch) {
  auto model = std::make_shared<models::MLPImpl>();
  copy_state(initial, *model);
  auto opt = sgd(*model);
  for (int64_t k = 0; k < steps; ++k) {
    opt.zero_grad();
    F::cross_entropy(model->forward(d.x.narrow(0, k * batch, batch)), d.y.narrow(0, k * batch, batch)).backward();
    opt.step();
  }
  return model;
}

// 2 ranks x batch B for K steps == 1 process x batch 2B over the same samples in the same order.
TEST(DistributedDataParallel, TwoRanksEqualOneProcessWithDoubleBatch) {
  constexpr int64_t kB = 16, kSteps = 5;
  const Data d = random_data(2 * kB * kSteps, 1);
  auto initial = std::make_shared<models::MLPImpl>();
  auto reference = train_reference(*initial, d, kSteps, 2 * kB);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    auto model = std::make_shared<models::MLPImpl>();
    if (rank == 0) copy_state(*initial, *model);  // rank 1 starts elsewhere: DDP broadcasts rank 0's
    DistributedDataParallel ddp(model, group);
    auto opt = sgd(*model);
    for (int64_t k = 0; k < kSteps; ++k) {
      const int64_t start = k * 2 * kB + rank * kB;
      opt.zero_grad();
      F::cross_entropy(ddp.forward(d.x.narrow(0, start, kB)), d.y.narrow(0, start, kB)).backward();
      opt.step();
    }
    EXPECT_LE(max_abs_diff(*model, *reference), kTol) << "rank " << rank;
  });
}

// Different data per rank, batch norm with buffer broadcast: parameters stay bit-identical.
TEST(DistributedDataParallel, AllRanksHoldIdenticalParametersAfterTraining) {
  const Data d = random_data(64, 2);
  std::vector<std::vector<torch::Tensor>> finals(2);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    auto model = std::make_shared<models::ConvNetImpl>();
    DistributedDataParallel ddp(model, group, DistributedDataParallelOptions().bucket_cap_mb(0.02));
    auto opt = sgd(*model);
    for (int64_t k = 0; k < 4; ++k) {
      opt.zero_grad();
      F::cross_entropy(ddp.forward(d.x.narrow(0, k * 16 + rank * 8, 8)), d.y.narrow(0, k * 16 + rank * 8, 8)).backward();
      opt.step();
    }
    for (const auto& p : model->parameters()) finals[rank].push_back(p.detach().clone());
  });
  ASSERT_EQ(finals[0].size(), finals[1].size());
  for (size_t i = 0; i < finals[0].size(); ++i) EXPECT_TRUE(torch::equal(finals[0][i], finals[1][i])) << i;
}

// The first bucket's all-reduce starts while gradients are still being produced.
TEST(DistributedDataParallel, FirstBucketStartsBeforeBackwardFinishes) {
  const Data d = random_data(16, 3);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    auto model = std::make_shared<models::ConvNetImpl>();
    DistributedDataParallel ddp(model, group, DistributedDataParallelOptions().bucket_cap_mb(0.01));
    const ReducerStats& stats = ddp.reducer_stats();
    ASSERT_GE(stats.buckets.size(), 3u);
    // Reverse registration order: the classifier's bias comes first.
    EXPECT_EQ(stats.buckets[0][0], static_cast<int64_t>(model->parameters().size()) - 1);
    F::cross_entropy(ddp.forward(d.x.narrow(0, rank * 8, 8)), d.y.narrow(0, rank * 8, 8)).backward();
    EXPECT_EQ(stats.hooks, static_cast<int64_t>(model->parameters().size()));
    EXPECT_LT(stats.hooks_before_launch[0], stats.hooks)
        << "bucket 0 started only after every gradient was ready: no overlap";
    for (size_t b = 1; b < stats.buckets.size(); ++b)
      EXPECT_GE(stats.hooks_before_launch[b], stats.hooks_before_launch[b - 1]);
  });
}

// k micro-batches under no_sync (loss / k) then one synced step == one step on the k-times batch.
TEST(DistributedDataParallel, NoSyncAccumulationEqualsOneLargeBatch) {
  constexpr int64_t kB = 8, kMicro = 3;
  const Data d = random_data(2 * kB * kMicro, 4);
  auto initial = std::make_shared<models::MLPImpl>();
  auto reference = train_reference(*initial, d, /*steps=*/1, /*batch=*/2 * kB * kMicro);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    auto model = std::make_shared<models::MLPImpl>();
    copy_state(*initial, *model);
    DistributedDataParallel ddp(model, group);
    auto opt = sgd(*model);
    opt.zero_grad();
    const int64_t base = rank * kB * kMicro;  // rank r's contiguous share of the big batch
    for (int64_t m = 0; m < kMicro; ++m) {
      auto loss = [&] {
        return F::cross_entropy(ddp.forward(d.x.narrow(0, base + m * kB, kB)), d.y.narrow(0, base + m * kB, kB)) / kMicro;
      };
      if (m + 1 < kMicro) {
        auto guard = ddp.no_sync();
        loss().backward();
      } else {
        loss().backward();
      }
    }
    opt.step();
    EXPECT_LE(max_abs_diff(*model, *reference), kTol) << "rank " << rank;
  });
}

// See Note [Gradients as bucket views]: with the option, .grad aliases the bucket (no copy back),
// and training is bit for bit what it is without it, through optimizer.zero_grad() (in place) and
// set-to-none zeroing, with accumulation under no_sync.
TEST(DistributedDataParallel, GradientsAsBucketViewsAliasTheBucketAndChangeNoBit) {
  constexpr int64_t kB = 8, kSteps = 3;
  const Data d = random_data(2 * kB * 2 * kSteps, 6);
  auto initial = std::make_shared<models::MLPImpl>();
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    std::vector<std::shared_ptr<models::MLPImpl>> models;
    for (bool as_view : {false, true}) {
      for (bool set_to_none : {false, true}) {
        auto model = std::make_shared<models::MLPImpl>();
        copy_state(*initial, *model);
        DistributedDataParallel ddp(model, group, DistributedDataParallelOptions().gradient_as_bucket_view(as_view));
        auto opt = sgd(*model);
        const void* first_grad = nullptr;
        for (int64_t k = 0; k < kSteps; ++k) {
          if (set_to_none) {
            for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
          } else {
            opt.zero_grad();
          }
          for (int64_t m = 0; m < 2; ++m) {  // two micro-batches, the first under no_sync
            const int64_t start = ((k * 2 + m) * 2 + rank) * kB;
            auto loss = [&] { return F::cross_entropy(ddp.forward(d.x.narrow(0, start, kB)), d.y.narrow(0, start, kB)) / 2; };
            if (m == 0) {
              auto guard = ddp.no_sync();
              loss().backward();
            } else {
              loss().backward();
            }
          }
          // The MLP's 0.8 MB of gradients fill one bucket: as views, they share its storage.
          EXPECT_EQ(model->fc1->weight.grad().is_alias_of(model->fc2->weight.grad()), as_view) << "step " << k;
          const void* grad = model->fc1->weight.grad().data_ptr();
          if (k == 0) first_grad = grad;
          if (as_view) EXPECT_EQ(grad, first_grad) << "step " << k;  // the bucket's memory, every step
          opt.step();
        }
        models.push_back(model);
      }
    }
    for (size_t i = 1; i < models.size(); ++i) EXPECT_EQ(max_abs_diff(*models[0], *models[i]), 0.0) << i;
  });
}

// An MLP with a head that forward uses only when asked.
struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl() {
    body = register_module("body", torch::nn::Linear(4, 4));
    spare = register_module("spare", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(torch::Tensor x, bool use_spare) {
    x = body->forward(x);
    return use_spare ? spare->forward(x) : x;
  }
  torch::nn::Linear body{nullptr}, spare{nullptr};
};

TEST(DistributedDataParallel, UnusedParameterWithoutOptionIsAnErrorNamingIt) {
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    auto model = std::make_shared<TwoHeadsImpl>();
    DistributedDataParallel ddp(model, group);
    std::string msg = testing::error_message([&] { ddp.forward(torch::ones({2, 4}), false).sum().backward(); });
    EXPECT_THAT(msg, HasSubstr("rank " + std::to_string(rank)));
    EXPECT_THAT(msg, HasSubstr("spare.weight"));
    EXPECT_THAT(msg, HasSubstr("find_unused_parameters(true)"));
  });
}

TEST(DistributedDataParallel, FindUnusedParametersAveragesWhatAnyRankUsed) {
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    auto model = std::make_shared<TwoHeadsImpl>();
    DistributedDataParallel ddp(model, group, DistributedDataParallelOptions().find_unused_parameters(true));
    // Nobody uses the spare head: its gradient stays undefined, as in PyTorch.
    ddp.forward(torch::ones({2, 4}), false).sum().backward();
    EXPECT_FALSE(model->spare->weight.grad().defined());
    EXPECT_TRUE(torch::allclose(model->body->bias.grad(), torch::full({4}, 2.0f)));
    model->zero_grad();
    // Only rank 0 uses it: every rank gets rank 0's gradient averaged over 2 ranks.
    ddp.forward(torch::ones({2, 4}), rank == 0).sum().backward();
    ASSERT_TRUE(model->spare->bias.grad().defined());
    EXPECT_TRUE(torch::allclose(model->spare->bias.grad(), torch::full({4}, 1.0f)));  // (2 + 0) / 2
  });
}

// Each rank's gradient is divided by the group size before the sum, as PyTorch's DDP does: on 2
// ranks that bit for bit (a / 2 + b / 2, each quotient from torch::div; the sum's order cannot
// matter), on 3 ranks within fp32 rounding of it (the sum's order is the backend's).
TEST(DistributedDataParallel, GradientsAreEachRanksDividedByTheGroupSizeThenSummed) {
  for (const int64_t ranks : {2, 3}) {
    SCOPED_TRACE(c10::str(ranks, " ranks"));
    run_ranks(ranks, [&](int64_t rank, dist::ProcessGroup& group) {
      auto model = std::make_shared<models::MLPImpl>();
      DistributedDataParallel ddp(model, group);  // rank 0's weights everywhere
      auto local = std::make_shared<models::MLPImpl>();
      copy_state(*model, *local);
      // Every rank's own gradient, computed on this rank too.
      std::vector<std::vector<torch::Tensor>> each;
      for (int64_t r = 0; r < ranks; ++r) {
        const Data d = random_data(4, 100 + static_cast<uint64_t>(r));
        local->zero_grad();
        F::cross_entropy(local->forward(d.x), d.y).backward();
        std::vector<torch::Tensor> grads;
        for (const auto& p : local->parameters()) grads.push_back(p.grad().clone());
        each.push_back(std::move(grads));
      }
      const Data mine = random_data(4, 100 + static_cast<uint64_t>(rank));
      F::cross_entropy(ddp.forward(mine.x), mine.y).backward();
      const auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        torch::Tensor want = torch::zeros_like(params[i]);
        for (int64_t r = 0; r < ranks; ++r) want += torch::div(each[r][i], static_cast<double>(ranks));
        if (ranks == 2) {
          EXPECT_TRUE(torch::equal(params[i].grad(), want)) << "parameter " << i << " on rank " << rank;
        } else {
          EXPECT_LE((params[i].grad() - want).abs().max().item<double>(), 1e-6) << "parameter " << i;
        }
      }
    });
  }
}

TEST(DistributedDataParallel, CompressionHooksStayCloseToFullPrecision) {
  const Data d = random_data(32, 5);
  auto initial = std::make_shared<models::MLPImpl>();
  for (CommHook compressed : {CommHook::kBf16Compress, CommHook::kFp16Compress}) {
  std::vector<torch::Tensor> grads(2);
  for (CommHook hook : {CommHook::kNone, compressed}) {
    run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
      auto model = std::make_shared<models::MLPImpl>();
      copy_state(*initial, *model);
      DistributedDataParallel ddp(model, group, DistributedDataParallelOptions().comm_hook(hook));
      F::cross_entropy(ddp.forward(d.x.narrow(0, rank * 16, 16)), d.y.narrow(0, rank * 16, 16)).backward();
      if (rank == 0) grads[hook == CommHook::kNone ? 0 : 1] = model->fc1->weight.grad().clone();
    });
  }
  // bf16 keeps 8 significant bits: relative error per element up to 2^-8.
  const double scale = grads[0].abs().max().item<double>();
  EXPECT_LE((grads[0] - grads[1]).abs().max().item<double>(), scale * 1e-2);
  EXPECT_FALSE(torch::equal(grads[0], grads[1]));  // the hook really changed the wire format
  }
}

TEST(DistributedDataParallel, DifferentModelsAcrossRanksNameTheFirstMismatch) {
  std::vector<std::string> messages(2);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    auto model = std::make_shared<models::MLPImpl>(784, rank == 0 ? 256 : 128, 10);
    messages[rank] = testing::error_message([&] { DistributedDataParallel ddp(model, group); });
  });
  EXPECT_THAT(messages[1], HasSubstr("rank 1 has parameter 'fc1.weight' [128, 784]"));
  EXPECT_THAT(messages[1], HasSubstr("rank 0 has parameter 'fc1.weight' [256, 784]"));
  EXPECT_THAT(messages[0], HasSubstr("1 of 2 ranks disagree with rank 0"));
}

}  // namespace
}  // namespace lockstep::parallel
