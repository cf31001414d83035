// The dynamic batcher (Note [Dynamic batching]) with stand-in model instances that record the
// batches they get: requests merge within the queue delay, a preferred size goes at once, each
// request gets its own rows back, instances run side by side, and the queue bound, the queue
// timeout and stop() behave as Triton's do.
#include "lockstep/serve/batcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using serve::Batcher;
using serve::BatcherOptions;
using serve::Tensors;

// An instance returning input * 10 + its own index, recording each batch's size.
struct Recorder {
  std::mutex mutex;
  std::vector<int64_t> sizes;
  Batcher::Instance instance(int index = 0) {
    return Batcher::one_tensor([this, index](const torch::Tensor& x) {
      std::lock_guard<std::mutex> lock(mutex);
      sizes.push_back(x.size(0));
      return x * 10 + index;
    });
  }
};

// A request of one input, (rows, 2).
Tensors sample(float value, int64_t rows = 1) { return {torch::full({rows, 2}, value)}; }

TEST(Batcher, MergesRequestsThatArriveWithinTheQueueDelayAndReturnEachItsRows) {
  Recorder r;
  serve::ModelStatistics stats;
  Batcher batcher({r.instance()}, BatcherOptions().max_batch_size(8).max_queue_delay_us(300000), stats);
  std::vector<std::future<Tensors>> results;
  for (int i = 0; i < 3; ++i) results.push_back(batcher.submit(sample(static_cast<float>(i), i + 1)));
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(results[i].wait_for(10s), std::future_status::ready);
    EXPECT_TRUE(torch::equal(results[i].get().at(0), sample(i * 10.0f, i + 1)[0]));
  }
  EXPECT_EQ(r.sizes, (std::vector<int64_t>{6}));  // 1 + 2 + 3 samples, one forward
  const auto s = stats.snapshot();
  EXPECT_EQ(s.inference_count, 6);
  EXPECT_EQ(s.execution_count, 1);
  EXPECT_EQ(s.queue.count, 3);
  EXPECT_EQ(s.batch_stats.at(6).compute_infer.count, 1);
}

TEST(Batcher, PreferredBatchSizeIsSentWithoutWaitingOutTheDelay) {
  Recorder r;
  serve::ModelStatistics stats;
  Batcher batcher({r.instance()},
                  BatcherOptions().max_batch_size(8).preferred_batch_sizes({2}).max_queue_delay_us(60000000), stats);
  auto a = batcher.submit(sample(1));
  auto b = batcher.submit(sample(2));
  // Under a minute's delay, only the preferred size can have sent them.
  ASSERT_EQ(b.wait_for(20s), std::future_status::ready);
  ASSERT_EQ(a.wait_for(1s), std::future_status::ready);
  EXPECT_EQ(r.sizes, (std::vector<int64_t>{2}));
}

TEST(Batcher, RequestThatWouldOverflowMaxBatchSizeGoesInTheNextBatch) {
  Recorder r;
  serve::ModelStatistics stats;
  Batcher batcher({r.instance()}, BatcherOptions().max_batch_size(4).max_queue_delay_us(200000), stats);
  auto a = batcher.submit(sample(1, 3));
  auto b = batcher.submit(sample(2, 2));
  ASSERT_EQ(a.wait_for(10s), std::future_status::ready);
  ASSERT_EQ(b.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(r.sizes, (std::vector<int64_t>{3, 2}));
  EXPECT_THROW(batcher.submit(sample(0, 5)), c10::ValueError);
}

TEST(Batcher, WithoutDynamicBatchingEveryRequestIsItsOwnForward) {
  Recorder r;
  serve::ModelStatistics stats;
  Batcher batcher({r.instance()}, BatcherOptions().max_batch_size(8).dynamic_batching(false), stats);
  auto a = batcher.submit(sample(1));
  auto b = batcher.submit(sample(2));
  a.wait();
  b.wait();
  EXPECT_EQ(r.sizes, (std::vector<int64_t>{1, 1}));
}

// Instances that wait inside forward until released, so the test controls when batches finish.
struct Gate {
  std::atomic<int> entered{0};
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
  Batcher::Instance instance(int index) {
    return Batcher::one_tensor([this, index](const torch::Tensor& x) {
      ++entered;
      if (opened.wait_for(20s) != std::future_status::ready) throw std::runtime_error("gate never opened");
      return x * 10 + index;
    });
  }
};

bool eventually(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(Batcher, InstancesRunBatchesSideBySide) {
  Gate gate;
  serve::ModelStatistics stats;
  Batcher batcher({gate.instance(0), gate.instance(1)}, BatcherOptions().max_batch_size(1), stats);
  auto a = batcher.submit(sample(1));
  auto b = batcher.submit(sample(2));
  // Both forwards are under way at once: one instance alone could never enter twice.
  ASSERT_TRUE(eventually([&] { return gate.entered == 2; }));
  gate.open.set_value();
  const float sum = a.get().at(0).sum().item<float>() + b.get().at(0).sum().item<float>();
  EXPECT_FLOAT_EQ(sum, 2 * (10 + 20) + 2 * (0 + 1));  // each instance added its index to its rows
}

TEST(Batcher, QueueBeyondMaxQueueSizeIsRefused) {
  Gate gate;
  serve::ModelStatistics stats;
  Batcher batcher({gate.instance(0)}, BatcherOptions().max_batch_size(1).max_queue_size(2), stats);
  auto running = batcher.submit(sample(1));
  ASSERT_TRUE(eventually([&] { return gate.entered == 1; }));
  auto q1 = batcher.submit(sample(2));
  auto q2 = batcher.submit(sample(3));
  EXPECT_EQ(stats.snapshot().pending, 2);
  try {
    batcher.submit(sample(4));
    ADD_FAILURE() << "a third queued request was accepted";
  } catch (const serve::Unavailable& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("max_queue_size 2"));
  }
  gate.open.set_value();
  EXPECT_EQ(q2.get().at(0).size(0), 1);
}

TEST(Batcher, RequestQueuedLongerThanTheTimeoutIsRefused) {
  Gate gate;
  serve::ModelStatistics stats;
  Batcher batcher({gate.instance(0)}, BatcherOptions().max_batch_size(1).queue_timeout_us(50000), stats);
  auto running = batcher.submit(sample(1));
  ASSERT_TRUE(eventually([&] { return gate.entered == 1; }));
  const auto queued_at = std::chrono::steady_clock::now();
  auto queued = batcher.submit(sample(2));
  ASSERT_TRUE(eventually([&] { return std::chrono::steady_clock::now() - queued_at > 60ms; }));
  auto next = batcher.submit(sample(3));  // the instance is still busy: this arrival finds it expired
  ASSERT_EQ(queued.wait_for(0s), std::future_status::ready);
  EXPECT_THROW(queued.get(), serve::Unavailable);
  gate.open.set_value();
  EXPECT_EQ(running.get().at(0).size(0), 1);
}

TEST(Batcher, StopRunsQueuedRequestsWithoutWaitingForTheDelayThenRefusesNewOnes) {
  Recorder r;
  serve::ModelStatistics stats;
  Batcher batcher({r.instance()}, BatcherOptions().max_batch_size(8).max_queue_delay_us(60000000), stats);
  auto a = batcher.submit(sample(1));
  auto b = batcher.submit(sample(2));
  batcher.stop();
  ASSERT_EQ(a.wait_for(0s), std::future_status::ready);
  EXPECT_EQ(b.get().at(0).size(0), 1);
  EXPECT_THROW(batcher.submit(sample(3)), serve::Unavailable);
}

TEST(Batcher, FailedForwardReachesEveryRequestOfTheBatch) {
  serve::ModelStatistics stats;
  Batcher batcher({[](const Tensors&) -> Tensors { throw std::runtime_error("kernel failed"); }},
                  BatcherOptions().max_batch_size(4).max_queue_delay_us(100000), stats);
  auto a = batcher.submit(sample(1));
  auto b = batcher.submit(sample(2));
  EXPECT_THROW(a.get(), std::runtime_error);
  EXPECT_THROW(b.get(), std::runtime_error);
  auto c = batcher.submit(sample(3));  // the batcher keeps going
  EXPECT_THROW(c.get(), std::runtime_error);
}

// A model of two inputs and two outputs: each input is concatenated across the batch's requests,
// and each request gets its own rows of both outputs.
TEST(Batcher, SeveralInputsAndOutputsAreBatchedAndSplitTogether) {
  std::vector<std::vector<int64_t>> seen;
  serve::ModelStatistics stats;
  Batcher batcher({[&seen](const Tensors& in) -> Tensors {
                    seen.push_back({in.at(0).size(0), in.at(1).size(0)});
                    return {in[0].sum(1) + in[1].to(torch::kFloat), in[1] * 2};
                  }},
                  BatcherOptions().max_batch_size(8).max_queue_delay_us(300000), stats);
  auto a = batcher.submit({torch::full({1, 3}, 1.0f), torch::tensor({7}, torch::kInt64)});
  auto b = batcher.submit({torch::full({2, 3}, 2.0f), torch::tensor({8, 9}, torch::kInt64)});
  ASSERT_EQ(b.wait_for(10s), std::future_status::ready);
  const Tensors ra = a.get(), rb = b.get();
  EXPECT_EQ(seen, (std::vector<std::vector<int64_t>>{{3, 3}}));  // one forward of 1 + 2 samples
  ASSERT_EQ(ra.size(), 2u);
  EXPECT_TRUE(torch::equal(ra[0], torch::tensor({10.0f})));
  EXPECT_TRUE(torch::equal(ra[1], torch::tensor({14}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(rb[0], torch::tensor({14.0f, 15.0f})));
  EXPECT_TRUE(torch::equal(rb[1], torch::tensor({16, 18}, torch::kInt64)));
  EXPECT_THROW(batcher.submit({torch::zeros({2, 3}), torch::zeros({1}, torch::kInt64)}), c10::ValueError);
}

// max_batch_size 0: no batch dimension, so nothing is concatenated: each request is one forward of
// its tensors as they are, whatever their first dimension.
TEST(Batcher, WithoutABatchDimensionEveryRequestRunsAloneAsItIs) {
  Recorder r;
  serve::ModelStatistics stats;
  Batcher batcher({r.instance()}, BatcherOptions().max_batch_size(0).max_queue_delay_us(300000), stats);
  auto a = batcher.submit({torch::full({3, 2}, 1.0f)});
  auto b = batcher.submit({torch::full({3, 2}, 2.0f)});
  EXPECT_TRUE(torch::equal(a.get().at(0), torch::full({3, 2}, 10.0f)));
  EXPECT_TRUE(torch::equal(b.get().at(0), torch::full({3, 2}, 20.0f)));
  EXPECT_EQ(r.sizes, (std::vector<int64_t>{3, 3}));  // two forwards of the whole (3, 2) tensor
  EXPECT_EQ(stats.snapshot().execution_count, 2);
}

}  // namespace
}  // namespace lockstep
