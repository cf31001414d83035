// train::Trainer as a user's program reaches it: a module of the user's own, data that implements
// TrainingData, options composed of each component's own.
#include "lockstep/train/trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <numeric>
#include <sstream>
#include <thread>

#include "../dist/multi_rank.h"
#include "../test_util.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/local_strategy.h"

namespace lockstep::train {
namespace {

using ::testing::HasSubstr;

// A module no zoo knows, and not a models::Classifier: (B, 8) -> (B, 3).
struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 16))), fc2(register_module("fc2", torch::nn::Linear(16, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(TwoLayer);

// Labels a fixed linear map of the features decides; every split the same map.
std::shared_ptr<TensorData> features(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto map = at::make_generator<at::CPUGeneratorImpl>(99);
  const torch::Tensor x = torch::randn({n, 8}, gen);
  return std::make_shared<TensorData>(x, x.matmul(torch::randn({8, 3}, map)).argmax(1));
}

parallel::StrategyOptions sgd(double lr) {
  const auto o = optim::OptimizerOptions(optim::OptimizerKind::kSGD, lr).momentum(0.9);
  return parallel::StrategyOptions().optimizer([o](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), o); });
}

TrainerOptions quiet() {
  return TrainerOptions().strategy(parallel::StrategyKind::kLocal).strategy_options(sgd(0.1)).batch_size(16)
      .reporter([](ReportKind, const std::string&) {});
}

std::map<std::string, torch::Tensor> weights(torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> w;
  for (const auto& p : m.named_parameters()) w.emplace(p.key(), p.value().detach().clone());
  return w;
}

TEST(TrainingData, DefaultCollateStacksTheSamplesGetReturns) {
  struct Squares : TrainingData {
    int64_t size() const override { return 5; }
    Example get(int64_t i) const override {
      return {torch::full({2}, static_cast<float>(i * i)), torch::tensor(i, torch::kLong)};
    }
  } squares;
  const Example b = squares.get_batch({3, 0, 4});
  EXPECT_TRUE(torch::equal(b.data, torch::tensor({{9.f, 9.f}, {0.f, 0.f}, {16.f, 16.f}})));
  EXPECT_TRUE(torch::equal(b.target, torch::tensor({3, 0, 4}, torch::kLong)));
  EXPECT_EQ(squares.count(b), 3);
  // The default order: DistributedSampler's for this replica, cut into batches; two replicas
  // share out every sample once.
  std::vector<int64_t> seen;
  for (int64_t r = 0; r < 2; ++r)
    for (const auto& batch : squares.batches({/*epoch=*/1, /*replicas=*/2, r, /*batch_size=*/2, /*seed=*/7}))
      seen.insert(seen.end(), batch.begin(), batch.end());
  EXPECT_EQ(seen.size(), 6u);  // 5 samples padded to 3 per replica, as DistributedSampler pads
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()) - seen.begin(), 5);
}

TEST(TrainingData, TensorDataRefusesMismatchedTensorsNamingTheCounts) {
  try {
    TensorData(torch::zeros({4, 2}), torch::zeros({3}, torch::kLong));
    FAIL() << "accepted 4 samples with 3 targets";
  } catch (const c10::ValueError& e) {
    EXPECT_THAT(e.what(), HasSubstr("data holds 4 samples but targets 3"));
  }
}

// The Trainer's local run is a plain LibTorch loop over the same batches, bit for bit: the same
// module, zero_grad / cross_entropy / backward / step in DistributedSampler's order.
TEST(TrainerApi, LocalRunOfAUsersModuleIsAPlainLoopBitForBit) {
  const auto data = features(96, 1);
  torch::manual_seed(5);
  TwoLayer mine;
  torch::manual_seed(5);
  TwoLayer reference;
  const TrainResult r = Trainer(torch::nn::AnyModule(mine), data, quiet().epochs(2).seed(3)).fit();

  torch::optim::SGD opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  std::vector<double> losses;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    for (const auto& batch : data->batches({epoch, 1, 0, 16, 3})) {
      const Example b = data->get_batch(batch);
      opt.zero_grad();
      const torch::Tensor loss = torch::nn::functional::cross_entropy(reference(b.data), b.target);
      loss.backward();
      opt.step();
      losses.push_back(loss.item<double>());
    }
  }
  EXPECT_EQ(r.step_losses, losses);
  const auto a = weights(*mine), b = weights(*reference);
  for (const auto& [name, t] : a) EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
  EXPECT_LT(losses.back(), losses.front());
  EXPECT_TRUE(std::isnan(r.test_acc));  // no held-out split given
}

// A strategy of the user's own drives the same loop (Note [The Strategy seam]).
TEST(TrainerApi, AUsersOwnStrategySubclassRunsTheLoop) {
  struct Counting : parallel::LocalStrategy {
    using LocalStrategy::LocalStrategy;
    std::string name() const override { return "counting"; }
    parallel::StepDecision step() override {
      ++*steps;
      return LocalStrategy::step();
    }
    std::shared_ptr<int> steps = std::make_shared<int>(0);
  };
  std::shared_ptr<int> steps;
  auto o = quiet().make_strategy([&steps](torch::nn::AnyModule m, parallel::StrategyOptions so) {
    auto s = std::make_unique<Counting>(std::move(m), std::move(so));
    steps = s->steps;
    return s;
  });
  Trainer trainer(torch::nn::AnyModule(TwoLayer()), features(64, 2), o.epochs(3));
  trainer.fit();
  EXPECT_EQ(trainer.strategy().name(), "counting");
  EXPECT_EQ(*steps, 12);  // 3 epochs x 64 / 16
}

// Held-out accuracy after each epoch; the progress display goes to the stream the caller chose.
TEST(TrainerApi, EvaluatesTheHeldOutSplitAndShowsProgressWhereTold) {
  std::ostringstream progress;
  std::vector<std::string> lines;
  auto o = quiet().epochs(2).progress(&progress).reporter([&lines](ReportKind, const std::string& l) { lines.push_back(l); });
  torch::manual_seed(0);
  const TrainResult r = Trainer(torch::nn::AnyModule(TwoLayer()), features(512, 3), o, features(200, 4)).fit();
  ASSERT_EQ(r.epochs.size(), 2u);
  EXPECT_GT(r.test_acc, 0.7);  // chance is 1/3
  EXPECT_EQ(r.test_acc, r.epochs.back().test_acc);
  EXPECT_THAT(progress.str(), HasSubstr("epoch 2/2"));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[1], HasSubstr("epoch 2/2 done: train_loss"));
  EXPECT_THAT(lines[1], HasSubstr("test_acc"));
}

// Stopped after one epoch and resumed from its checkpoint, a run ends where an uninterrupted one
// ends, bit for bit; the checkpoint is the one `lockstep train` writes.
TEST(TrainerApi, ResumedRunEndsWhereAnUninterruptedRunEnds) {
  testing::TempDir dir;
  const auto data = features(128, 5);
  auto run = [&](int64_t epochs, const std::string& ckpt, const std::string& resume) {
    torch::manual_seed(1);
    TwoLayer m;
    auto o = quiet().epochs(epochs).checkpoint(CheckpointerOptions().dir(ckpt).resume(resume));
    Trainer(torch::nn::AnyModule(m), data, o).fit();
    return weights(*m);
  };
  const auto whole = run(3, dir / "a", "");
  run(1, dir / "b", "");
  const auto resumed = run(3, dir / "b", "latest");
  for (const auto& [name, t] : whole) EXPECT_TRUE(torch::equal(t, resumed.at(name))) << name;
  EXPECT_TRUE(std::filesystem::exists(dir / "b/step-00000024.pt"));  // 3 epochs x 8 steps
}

// A stop asked for during step 11 (of 8 per epoch) ends the run at that step boundary with a
// checkpoint of it; resumed from there, the run ends where an uninterrupted one ends, bit for bit.
TEST(TrainerApi, AStopEndsTheRunAtAStepBoundaryThatResumesExactly) {
  testing::TempDir dir;
  const auto data = features(128, 5);
  auto run = [&](const std::string& ckpt, const std::string& resume, std::function<bool()> stop, TrainResult* out) {
    torch::manual_seed(1);
    TwoLayer m;
    auto o = quiet().epochs(3).checkpoint(CheckpointerOptions().dir(ckpt).resume(resume)).stop_requested(stop);
    *out = Trainer(torch::nn::AnyModule(m), data, o).fit();
    return weights(*m);
  };
  TrainResult whole_result, stopped, resumed_result;
  const auto whole = run(dir / "a", "", nullptr, &whole_result);
  int64_t polls = 0;
  run(dir / "b", "", [&] { return ++polls >= 11; }, &stopped);
  EXPECT_TRUE(stopped.stopped);
  EXPECT_EQ(stopped.steps, 11);
  EXPECT_EQ(polls, 11);  // once per step, not again after the stop
  EXPECT_TRUE(std::filesystem::exists(dir / "b/step-00000011.pt"));
  const auto resumed = run(dir / "b", "latest", [] { return false; }, &resumed_result);
  EXPECT_FALSE(resumed_result.stopped);
  EXPECT_EQ(resumed_result.steps, 24);
  for (const auto& [name, t] : whole) EXPECT_TRUE(torch::equal(t, resumed.at(name))) << name;
}

// Issue 54 item 1: fit() again after a stop dereferenced the reset loader (SIGSEGV); after a
// finished run it trained nothing and returned the first result. Both are refused saying what ran
// and what to do.
TEST(TrainerApi, FitRunsOnceAndASecondCallSaysWhatRanAndWhatToDo) {
  testing::TempDir dir;
  const auto data = features(64, 5);
  TwoLayer m;
  int64_t polls = 0;
  Trainer stopped(torch::nn::AnyModule(m), data,
                  quiet().epochs(2).checkpoint(CheckpointerOptions().dir(dir / "c")).stop_requested([&] { return ++polls >= 3; }));
  EXPECT_TRUE(stopped.fit().stopped);
  EXPECT_THAT(testing::error_message([&] { stopped.fit(); }),
              HasSubstr("Trainer::fit() has already run on this Trainer and stopped as asked at step 3 (epoch 1 of 2); "
                        "to continue, make a new Trainer on the same checkpoint directory with checkpoint resume "
                        "\"latest\""));
  Trainer finished(torch::nn::AnyModule(TwoLayer()), data, quiet().epochs(1));
  EXPECT_EQ(finished.fit().steps, 4);
  EXPECT_THAT(testing::error_message([&] { finished.fit(); }),
              HasSubstr("has already run on this Trainer and trained all 1 epochs (4 steps); a Trainer fits once"));
}

// Issue 54 item 2: the user's handle on the group dropped between making the Trainer and fit()
// pulled the group from under ddp (SIGSEGV). Two real ranks over Gloo train to the end.
TEST(TrainerApi, AGroupHandleDroppedBeforeFitLeavesTheTrainersGroupAlive) {
  const int port = testing::free_port();
  const auto data = features(64, 7);
  std::vector<std::map<std::string, torch::Tensor>> trained(2);
  std::vector<TrainResult> results(2);
  std::vector<std::exception_ptr> errors(2);
  std::vector<std::thread> ranks;
  for (int64_t r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        std::unique_ptr<Trainer> trainer;
        std::weak_ptr<dist::ProcessGroup> seen;
        {
          std::shared_ptr<dist::ProcessGroup> group = dist::init_process_group(testing::loopback(r, 2, port));
          seen = group;
          torch::manual_seed(r);  // ddp starts every rank from rank 0's weights
          trainer = std::make_unique<Trainer>(torch::nn::AnyModule(TwoLayer()), data,
                                              quiet().strategy(parallel::StrategyKind::kDdp).epochs(2)
                                                  .strategy_options(sgd(0.1).group(group)));
        }  // the user's handle and options are gone
        results[r] = trainer->fit();
        trained[r] = weights(trainer->strategy().module());
        EXPECT_FALSE(seen.expired());
        trainer.reset();
        EXPECT_TRUE(seen.expired()) << "the Trainer's share went with it";
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].world_size, 2);
    EXPECT_EQ(results[r].steps, 4);  // 2 epochs x 32 samples per rank / 16
  }
  for (const auto& [name, t] : trained[0]) EXPECT_TRUE(torch::equal(t, trained[1].at(name))) << name;
}

// Issue 54 item 16: a label the model has no class for was LibTorch's "Target 7 is out of bounds",
// naming no sample; in the held-out split it counted as a wrong answer without a word.
TEST(TrainerApi, ALabelOutsideTheModelsClassesNamesTheSampleTheLabelAndTheClasses) {
  const auto data = features(48, 8);
  std::vector<int64_t> all(48);
  std::iota(all.begin(), all.end(), 0);
  const Example whole = data->get_batch(all);
  torch::Tensor bad = whole.target.clone();
  bad[13] = 7;  // TwoLayer outputs 3 classes
  EXPECT_THAT(testing::error_message([&] {
                Trainer(torch::nn::AnyModule(TwoLayer()), std::make_shared<TensorData>(whole.data, bad), quiet()).fit();
              }),
              HasSubstr("sample 13 of the training split has label 7, but the model outputs 3 classes (labels 0 to 2)"));
  // Outside the Trainer the library's loss names the row.
  EXPECT_THAT(testing::error_message([] { train::cross_entropy_loss(torch::zeros({3, 4}), torch::tensor({0, 7, -100})); }),
              HasSubstr("cross_entropy_loss: label 7 in row 1 of the batch is not a class of the model's 4 outputs "
                        "(labels 0 to 3)"));
  torch::Tensor held_out = whole.target.clone();
  held_out[42] = -2;
  EXPECT_THAT(testing::error_message([&] {
                Trainer(torch::nn::AnyModule(TwoLayer()), data, quiet(), std::make_shared<TensorData>(whole.data, held_out)).fit();
              }),
              HasSubstr("sample 42 of the held-out split has label -2, but the model outputs 3 classes (labels 0 to 2)"));
}

// Issue 54 item 17: a regression trained with an MSE loss reported test_acc 0 (the argmax of one
// column). Unset, the metric is accuracy only for class-index targets; here the held-out loss.
TEST(TrainerApi, ARegressionIsMeasuredByItsHeldOutLossNotByAnAccuracy) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const torch::Tensor x = torch::randn({256, 8}, gen), w = torch::randn({8, 1}, gen);
  const auto split = [&](int64_t begin, int64_t n) {
    return std::make_shared<TensorData>(x.narrow(0, begin, n), x.narrow(0, begin, n).matmul(w));  // (n, 1) fp32
  };
  std::vector<std::string> lines;
  auto o = quiet().epochs(10).loss([](const torch::Tensor& out, const torch::Tensor& y) { return torch::mse_loss(out, y); })
               .reporter([&lines](ReportKind, const std::string& l) { lines.push_back(l); });
  torch::manual_seed(0);
  const TrainResult r = Trainer(torch::nn::AnyModule(torch::nn::Linear(8, 1)), split(0, 192), o, split(192, 64)).fit();
  EXPECT_TRUE(std::isnan(r.test_acc)) << r.test_acc;
  EXPECT_LT(r.test_loss, 0.05 * w.pow(2).sum().item<double>());  // E[y^2] = |w|^2: it learned
  EXPECT_EQ(r.test_loss, r.epochs.back().test_loss);
  EXPECT_THAT(r.summary_json(), HasSubstr("\"test_acc\":null,\"test_loss\":"));
  ASSERT_EQ(lines.size(), 1u);  // said once, not per epoch
  EXPECT_THAT(lines[0], HasSubstr("held-out metric: the loss only (test_loss), not accuracy: the targets are Float, "
                                  "not class indices (integers); set TrainerOptions::metric to choose"));
  // Asked for, accuracy of a regression is refused; kNone measures a classifier's loss only.
  EXPECT_THAT(testing::error_message([&] {
                Trainer(torch::nn::AnyModule(torch::nn::Linear(8, 1)), split(0, 64), o.metric(Metric::kAccuracy),
                        split(192, 64)).fit();
              }),
              HasSubstr("the accuracy metric compares the argmax of the model's output with class-index targets, but "
                        "the targets are Float, not class indices (integers): measure the held-out loss only with "
                        "Metric::kNone"));
  const TrainResult c = Trainer(torch::nn::AnyModule(TwoLayer()), features(64, 3), quiet().metric(Metric::kNone),
                                features(64, 4)).fit();
  EXPECT_TRUE(std::isnan(c.test_acc));
  EXPECT_GT(c.test_loss, 0.0);
}

TEST(TrainerApi, RefusesBadOptionsNamingTheValue) {
  const auto data = features(32, 6);
  const auto refused = [&](const TrainerOptions& o) {
    try {
      Trainer(torch::nn::AnyModule(TwoLayer()), data, o);
    } catch (const c10::ValueError& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("accepted");
  };
  EXPECT_THAT(refused(quiet().epochs(0)), HasSubstr("epochs=0 must be at least 1"));
  EXPECT_THAT(refused(quiet().accum_steps(0)), HasSubstr("accum_steps=0"));
  EXPECT_THAT(refused(quiet().checkpoint(CheckpointerOptions().save_every(5))), HasSubstr("set dir"));
  // Activation checkpointing needs the model's blocks.
  EXPECT_THAT(refused(quiet().checkpoint_activations(true)), HasSubstr("models::Classifier"));
}

}  // namespace
}  // namespace lockstep::train
