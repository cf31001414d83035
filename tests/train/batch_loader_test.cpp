// The background loader: the same batches in the same order for any number of workers, at most
// workers x prefetch batches ahead, a worker's error delivered with its batch, and no hang when an
// epoch is left early.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "../test_util.h"
#include "lockstep/data/transforms.h"
#include "lockstep/train/batch_loader.h"

namespace lockstep::train {
namespace {

using ::testing::HasSubstr;

// Sample i of epoch e: 4 random numbers keyed by (seed, e, i), and i as the target; it records
// how many batches are being built at once and how far ahead of the consumer they are.
class Recorded : public TrainingData {
 public:
  int64_t size() const override { return 103; }
  Example get(int64_t index) const override {
    data::SampleRandom random(seed_, epoch_, index);
    torch::Tensor x = torch::empty({4});
    for (int64_t k = 0; k < 4; ++k) x[k] = random.uniform();
    if (index == fail_at) throw std::runtime_error("sample " + std::to_string(index) + " is broken");
    return {x, torch::tensor(index)};
  }
  Example get_batch(const std::vector<int64_t>& indices) const override {
    const int64_t now = ++building_;
    int64_t seen = most_building_.load();
    while (now > seen && !most_building_.compare_exchange_weak(seen, now)) {
    }
    if (gate) {
      std::unique_lock<std::mutex> lock(gate_mutex_);
      gate_open_.wait(lock, [&] { return released_ > 0; });
      --released_;
    }
    Example batch = TrainingData::get_batch(indices);
    --building_;
    ++built_;
    return batch;
  }
  void set_epoch(int64_t epoch, uint64_t seed) override {
    epoch_ = epoch;
    seed_ = seed;
  }
  // With `gate`, each get_batch waits for a release.
  void release(int64_t n) {
    {
      std::lock_guard<std::mutex> lock(gate_mutex_);
      released_ += n;
    }
    gate_open_.notify_all();
  }

  int64_t fail_at = -1;
  bool gate = false;
  mutable std::atomic<int64_t> building_{0}, most_building_{0}, built_{0};

 private:
  int64_t epoch_ = 0;
  uint64_t seed_ = 0;
  mutable std::mutex gate_mutex_;
  mutable std::condition_variable gate_open_;
  mutable int64_t released_ = 0;
};

std::vector<std::vector<int64_t>> epoch_of(int64_t epoch, int64_t replicas = 1, int64_t replica = 0, int64_t batch = 10) {
  return sampler_batches(103, {epoch, replicas, replica, batch, /*seed=*/7});
}

std::vector<Example> load_epochs(int64_t workers, int64_t prefetch, int64_t epochs) {
  auto data = std::make_shared<Recorded>();
  BatchLoader loader(data, LoaderOptions().workers(workers).prefetch(prefetch));
  std::vector<Example> out;
  for (int64_t e = 0; e < epochs; ++e) {
    const auto batches = epoch_of(e);
    loader.start(batches, 0, e, 7);
    for (size_t b = 0; b < batches.size(); ++b) out.push_back(loader.next());
  }
  return out;
}

TEST(BatchLoader, AnyNumberOfWorkersGivesTheSameBatchesBitForBit) {
  const std::vector<Example> reference = load_epochs(0, 2, 2);
  ASSERT_EQ(reference.size(), 22u);  // 11 batches of 103 samples by 10, twice
  EXPECT_FALSE(torch::equal(reference[0].data, reference[11].data)) << "a new epoch reshuffles and redraws";
  for (int64_t workers : {1, 2, 4}) {
    for (int64_t prefetch : {1, 3}) {
      const std::vector<Example> got = load_epochs(workers, prefetch, 2);
      ASSERT_EQ(got.size(), reference.size());
      for (size_t b = 0; b < got.size(); ++b) {
        EXPECT_TRUE(torch::equal(got[b].data, reference[b].data)) << workers << " workers, batch " << b;
        EXPECT_TRUE(torch::equal(got[b].target, reference[b].target)) << workers << " workers, batch " << b;
      }
    }
  }
}

// One process with batch 20 sees at each step exactly the samples two replicas with batch 10 see
// together, each transformed alike: what makes the global batches independent of the world size.
TEST(BatchLoader, TwoReplicasTogetherSeeWhatOneSeesWithTheDoubleBatch) {
  auto data = std::make_shared<Recorded>();
  BatchLoader one(data, LoaderOptions().workers(2));
  const auto whole = epoch_of(1, 1, 0, 20);
  one.start(whole, 0, 1, 7);
  std::vector<Example> halves[2];
  for (int64_t r = 0; r < 2; ++r) {
    BatchLoader loader(data, LoaderOptions().workers(1 + r));
    const auto batches = epoch_of(1, 2, r, 10);
    loader.start(batches, 0, 1, 7);
    for (size_t b = 0; b < batches.size(); ++b) halves[r].push_back(loader.next());
  }
  ASSERT_EQ(halves[0].size(), whole.size());
  // All but the last step: two replicas pad 103 samples to 104 with a repeat (DistributedSampler).
  for (size_t b = 0; b + 1 < whole.size(); ++b) {
    const Example step = one.next();
    const torch::Tensor targets = torch::cat({halves[0][b].target, halves[1][b].target});
    const torch::Tensor data_rows = torch::cat({halves[0][b].data, halves[1][b].data});
    const auto order_one = step.target.argsort(), order_two = targets.argsort();
    EXPECT_TRUE(torch::equal(step.target.index_select(0, order_one), targets.index_select(0, order_two))) << b;
    EXPECT_TRUE(torch::equal(step.data.index_select(0, order_one), data_rows.index_select(0, order_two))) << b;
  }
}

TEST(BatchLoader, StartingMidEpochGivesTheRestOfTheSameEpoch) {
  auto data = std::make_shared<Recorded>();
  const auto batches = epoch_of(3);
  BatchLoader whole(data, LoaderOptions().workers(2));
  whole.start(batches, 0, 3, 7);
  std::vector<Example> all;
  for (size_t b = 0; b < batches.size(); ++b) all.push_back(whole.next());
  BatchLoader resumed(data, LoaderOptions().workers(3));
  resumed.start(batches, 4, 3, 7);
  for (size_t b = 4; b < batches.size(); ++b) EXPECT_TRUE(torch::equal(resumed.next().data, all[b].data)) << b;
  EXPECT_THROW(resumed.next(), c10::Error);
}

TEST(BatchLoader, WorkersBuildAtMostPrefetchBatchesEachAheadOfTheStep) {
  auto data = std::make_shared<Recorded>();
  data->gate = true;
  BatchLoader loader(data, LoaderOptions().workers(2).prefetch(2));
  loader.start(epoch_of(0), 0, 0, 7);
  data->release(100);  // every batch may finish at once; none is taken yet
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (data->built_ < 4 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  // The window is full: 4 built, and no worker may start a fifth until the step takes one.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // time for a wrong fifth to appear
  EXPECT_EQ(data->built_.load(), 4);
  EXPECT_LE(data->most_building_.load(), 2);
  loader.next();
  while (data->built_ < 5 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(data->built_.load(), 5);
}

TEST(BatchLoader, AWorkersErrorArrivesWithItsBatchAndTheBatchesBeforeItArriveIntact) {
  for (int64_t workers : {0, 2}) {
    auto data = std::make_shared<Recorded>();
    const auto batches = epoch_of(0);
    int64_t bad_batch = 5;
    data->fail_at = batches[bad_batch][3];
    BatchLoader loader(data, LoaderOptions().workers(workers));
    loader.start(batches, 0, 0, 7);
    for (int64_t b = 0; b < bad_batch; ++b) EXPECT_EQ(loader.next().target.size(0), 10);
    try {
      loader.next();
      ADD_FAILURE() << "batch " << bad_batch << " holds a broken sample";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("sample " + std::to_string(data->fail_at) + " is broken"));
    }
    // The next epoch starts clean after an epoch left early.
    data->fail_at = -1;
    loader.start(epoch_of(1), 0, 1, 7);
    EXPECT_EQ(loader.next().target.size(0), 10);
  }
}

// Issue 54 item 16: a sample shaped unlike its batch was LibTorch's "stack expects each tensor to
// be equal size", naming no sample. The default collate names it by its index in the split, on
// the training thread or a worker's.
TEST(BatchLoader, ASampleShapedUnlikeItsBatchIsNamedWithBothShapes) {
  struct OneOdd : TrainingData {
    int64_t size() const override { return 12; }
    Example get(int64_t i) const override {
      if (i == 9) return {torch::zeros({9}), torch::tensor(int64_t{1})};
      if (i == 4) return {torch::zeros({8}), torch::zeros({2}, torch::kLong)};
      return {torch::zeros({8}), torch::tensor(int64_t{1})};
    }
  };
  for (int64_t workers : {0, 2}) {
    BatchLoader loader(std::make_shared<OneOdd>(), LoaderOptions().workers(workers));
    loader.start({{2, 9, 5}, {7, 4}}, 0, 0, 7);
    EXPECT_THAT(testing::error_message([&] { loader.next(); }),
                HasSubstr("sample 9 has data shaped [9], but sample 2, the first of its batch, has [8]"));
    EXPECT_THAT(testing::error_message([&] { loader.next(); }),
                HasSubstr("sample 4 has a target shaped [2], but sample 7, the first of its batch, has []"));
  }
  // Called directly, collate knows positions only.
  std::vector<Example> samples{{torch::zeros({8}), torch::tensor(1)}, {torch::zeros({9}), torch::tensor(1)}};
  EXPECT_THAT(testing::error_message([&] { OneOdd().collate(samples); }),
              HasSubstr("sample 1 of the batch has data shaped [9], but sample 0, the first of its batch, has [8]"));
}

TEST(BatchLoader, ALoaderDestroyedWhileItsWorkersBuildReturnsAtOnce) {
  auto data = std::make_shared<Recorded>();
  data->gate = true;
  const auto t0 = std::chrono::steady_clock::now();
  {
    BatchLoader loader(data, LoaderOptions().workers(4).prefetch(2));
    loader.start(epoch_of(0), 0, 0, 7);
    data->release(1000);
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

TEST(BatchLoader, BadOptionsAreRefusedNamingTheValue) {
  auto data = std::make_shared<Recorded>();
  try {
    BatchLoader(data, LoaderOptions().workers(-1));
    ADD_FAILURE();
  } catch (const c10::ValueError& e) {
    EXPECT_THAT(e.what(), HasSubstr("workers -1"));
  }
  try {
    BatchLoader(data, LoaderOptions().prefetch(0));
    ADD_FAILURE();
  } catch (const c10::ValueError& e) {
    EXPECT_THAT(e.what(), HasSubstr("prefetch 0"));
  }
}

}  // namespace
}  // namespace lockstep::train
