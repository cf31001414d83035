#include "lockstep/amp/grad_scaler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <limits>

#include "../dist/multi_rank.h"
#include "../test_util.h"
#include "lockstep/core/torch_save.h"
#include "lockstep/parallel/distributed_data_parallel.h"

namespace lockstep::amp {
namespace {

using ::testing::HasSubstr;
using lockstep::testing::error_message;
using lockstep::testing::run_ranks;

constexpr float kInf = std::numeric_limits<float>::infinity();

// y = w . x + b on a fixed batch; the loss is mean squared error. Seeded so ranks agree.
struct Tiny {
  Tiny() : model((torch::manual_seed(0), torch::nn::Linear(3, 1))), optimizer(model->parameters(), 0.1) {}
  torch::Tensor loss() {
    const auto x = torch::arange(12, torch::kFloat).reshape({4, 3}) / 10;
    return (model->forward(x).squeeze(1) - torch::tensor({1.f, -1.f, 2.f, 0.f})).pow(2).mean();
  }
  std::vector<torch::Tensor> snapshot() const {
    std::vector<torch::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
    return out;
  }
  bool unchanged_since(const std::vector<torch::Tensor>& before) const {
    auto now = model->parameters();
    for (size_t i = 0; i < now.size(); ++i)
      if (!torch::equal(now[i], before[i])) return false;
    return true;
  }
  torch::nn::Linear model;
  torch::optim::SGD optimizer;
};

TEST(GradScaler, DefaultsArePyTorchs) {
  GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.get_growth_factor(), 2.0);
  EXPECT_EQ(scaler.get_backoff_factor(), 0.5);
  EXPECT_EQ(scaler.get_growth_interval(), 2000);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
  EXPECT_TRUE(scaler.is_enabled());
}

TEST(GradScaler, InvalidOptionsAreErrorsNamingTheValue) {
  auto message = [](GradScalerOptions o) { return error_message([&] { GradScaler s(o); }); };
  EXPECT_THAT(message(GradScalerOptions().growth_factor(1.0)), HasSubstr("growth_factor must be > 1, got 1"));
  EXPECT_THAT(message(GradScalerOptions().backoff_factor(1.5)), HasSubstr("backoff_factor must be in (0, 1), got 1.5"));
  EXPECT_THAT(message(GradScalerOptions().backoff_factor(0)), HasSubstr("backoff_factor must be in (0, 1), got 0"));
  EXPECT_THAT(message(GradScalerOptions().growth_interval(0)), HasSubstr("growth_interval must be >= 1, got 0"));
  EXPECT_THAT(message(GradScalerOptions().init_scale(-2)), HasSubstr("init_scale must be a positive finite number, got -2"));
  EXPECT_EQ(message(GradScalerOptions().growth_factor(0.5).enabled(false)), "<no error>");  // as in Python
}

// Inf gradients at steps 3 and 7, growth_interval 3: the scale and skipped steps follow the rule,
// recomputed here by an independent loop. Python's torch._amp_update_scale_ has no CPU kernel in
// 1.13, so this cannot be compared against PyTorch itself.
TEST(GradScaler, ScaleAndSkippedStepsFollowTheUpdateRuleWithInfAtSteps3And7) {
  Tiny t;
  GradScaler scaler(GradScalerOptions().init_scale(1024).growth_interval(3));
  double expected_scale = 1024;
  int64_t expected_tracker = 0;
  for (int step = 1; step <= 12; ++step) {
    const bool inject = step == 3 || step == 7;
    t.optimizer.zero_grad();
    auto scaled = scaler.scale(t.loss());
    EXPECT_EQ(scaled.item<float>(), t.loss().item<float>() * static_cast<float>(expected_scale)) << step;
    scaled.backward();
    if (inject) t.model->weight.mutable_grad()[0][1] = kInf;
    const auto before = t.snapshot();
    const bool stepped = scaler.step(t.optimizer);
    scaler.update();

    EXPECT_EQ(stepped, !inject) << "step " << step;
    EXPECT_EQ(t.unchanged_since(before), inject) << "step " << step;
    if (inject) {
      expected_scale *= 0.5;
      expected_tracker = 0;
    } else if (++expected_tracker == 3) {
      expected_scale *= 2;
      expected_tracker = 0;
    }
    EXPECT_EQ(scaler.get_scale(), expected_scale) << "step " << step;
    EXPECT_EQ(scaler.get_growth_tracker(), expected_tracker) << "step " << step;
  }
  // Steps 1-2 count up, 3 (inf) halves to 512, 4-6 grow back to 1024, 7 halves, 8-10 grow, 11-12 count.
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 2);
}

// Unscaled gradients equal the unscaled loss's gradients bit for bit (the scale is a power of 2),
// and step() after unscale_() does not divide again.
TEST(GradScaler, UnscaleRecoversTrueGradientsOnce) {
  Tiny reference, t;
  reference.loss().backward();
  GradScaler scaler;
  scaler.scale(t.loss()).backward();
  EXPECT_FALSE(torch::equal(t.model->weight.grad(), reference.model->weight.grad()));
  scaler.unscale_(t.optimizer);
  EXPECT_TRUE(torch::equal(t.model->weight.grad(), reference.model->weight.grad()));
  EXPECT_TRUE(scaler.step(t.optimizer));
  reference.optimizer.step();
  EXPECT_TRUE(t.unchanged_since(reference.snapshot()));
}

TEST(GradScaler, CallsOutOfOrderAreErrorsWithPyTorchsMessages) {
  Tiny t;
  GradScaler scaler;
  scaler.scale(t.loss()).backward();
  scaler.unscale_(t.optimizer);
  EXPECT_THAT(error_message([&] { scaler.unscale_(t.optimizer); }),
              HasSubstr("unscale_() has already been called on this optimizer since the last update()."));
  scaler.step(t.optimizer);
  EXPECT_THAT(error_message([&] { scaler.step(t.optimizer); }),
              HasSubstr("step() has already been called since the last update()."));
  EXPECT_THAT(error_message([&] { scaler.unscale_(t.optimizer); }),
              HasSubstr("unscale_() is being called after step()."));
  scaler.update();
  EXPECT_THAT(error_message([&] { scaler.update(); }), HasSubstr("No inf checks were recorded prior to update()"));
  t.optimizer.zero_grad();
  scaler.scale(t.loss()).backward();
  EXPECT_TRUE(scaler.step(t.optimizer)) << "update() starts a new iteration";
}

TEST(GradScaler, HalfOutputsAreScaledInFp32) {
  GradScaler scaler;
  const auto scaled = scaler.scale(torch::tensor(2.0f).to(torch::kHalf));  // 131072 overflows fp16
  EXPECT_EQ(scaled.scalar_type(), torch::kFloat);
  EXPECT_EQ(scaled.dim(), 0);
  EXPECT_EQ(scaled.item<float>(), 131072.f);
}

TEST(GradScaler, UpdateWithNewScaleSetsIt) {
  Tiny t;
  GradScaler scaler;
  scaler.scale(t.loss()).backward();
  scaler.step(t.optimizer);
  scaler.update(8.0);
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_THAT(error_message([&] { scaler.update(-1.0); }), HasSubstr("new_scale must be a positive finite number, got -1"));
}

TEST(GradScaler, DisabledIsANoOp) {
  Tiny t;
  GradScaler scaler(GradScalerOptions().enabled(false));
  const auto loss = t.loss();
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  t.model->bias.mutable_grad().fill_(kInf);
  EXPECT_TRUE(scaler.step(t.optimizer)) << "a disabled scaler steps whatever the gradients";
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_EQ(scaler.state_dict().size(), 0u);
}

// One inf step (256 -> 64), three finite ones (-> 256), two more (tracker 2).
GradScaler trained_scaler() {
  Tiny t;
  GradScaler scaler(GradScalerOptions().init_scale(256).growth_interval(3).growth_factor(4).backoff_factor(0.25));
  for (int step = 1; step <= 6; ++step) {
    t.optimizer.zero_grad();
    scaler.scale(t.loss()).backward();
    if (step == 1) t.model->bias.mutable_grad().fill_(kInf);
    scaler.step(t.optimizer);
    scaler.update();
  }
  return scaler;
}

TEST(GradScaler, StateDictRoundTripsThroughAPickleFile) {
  const GradScaler trained = trained_scaler();
  ASSERT_EQ(trained.get_scale(), 256.0);  // 256 / 4 * 4
  ASSERT_EQ(trained.get_growth_tracker(), 2);
  testing::TempDir dir;
  {
    const std::vector<char> bytes = torch::pickle_save(trained.state_dict());
    std::ofstream(dir / "scaler.pt", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const std::string text = testing::read_text(dir / "scaler.pt");
  const auto loaded = torch::pickle_load(std::vector<char>(text.begin(), text.end())).toGenericDict();
  GradScaler fresh;
  fresh.load_state_dict(loaded);
  EXPECT_EQ(fresh.get_scale(), trained.get_scale());
  EXPECT_EQ(fresh.get_growth_tracker(), trained.get_growth_tracker());
  EXPECT_EQ(fresh.get_growth_factor(), 4.0);
  EXPECT_EQ(fresh.get_backoff_factor(), 0.25);
  EXPECT_EQ(fresh.get_growth_interval(), 3);
}

TEST(GradScaler, LoadStateDictErrorsNameTheKey) {
  GradScaler scaler;
  auto load_without = [&](const std::string& key) {
    StateDict state = GradScaler().state_dict();
    static_cast<void>(state.erase(key));
    return error_message([&] { scaler.load_state_dict(state); });
  };
  EXPECT_THAT(load_without("_growth_tracker"), HasSubstr("missing key '_growth_tracker'"));
  EXPECT_THAT(load_without("scale"), HasSubstr("missing key 'scale'"));
  StateDict wrong = GradScaler().state_dict();
  wrong.insert_or_assign("growth_interval", 3.5);
  EXPECT_THAT(error_message([&] { scaler.load_state_dict(wrong); }), HasSubstr("'growth_interval' must be an int, got Double"));
  wrong = GradScaler().state_dict();
  wrong.insert_or_assign("backoff_factor", 2.0);
  EXPECT_THAT(error_message([&] { scaler.load_state_dict(wrong); }),
              HasSubstr("GradScaler::load_state_dict: backoff_factor must be in (0, 1), got 2"));
  EXPECT_THAT(error_message([&] { scaler.load_state_dict(StateDict(c10::StringType::get(), c10::AnyType::get())); }), HasSubstr("The source state dict is empty"));
  EXPECT_EQ(scaler.get_scale(), 65536.0) << "a failed load changes nothing";
}

// Python's own GradScaler reads our file and we read its. Without CUDA, Python's GradScaler
// disables itself; the script re-enables it, which is enough for its state_dict code.
TEST(GradScaler, PythonGradScalerLoadsOurStateDictAndWeLoadItsOwn) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  testing::TempDir dir;
  const std::vector<char> bytes = torch_save(trained_scaler().state_dict());
  std::ofstream(dir / "ours.pt", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const auto r = testing::run_command(python + " " LOCKSTEP_SOURCE_DIR "/tests/python/amp_grad_scaler.py " +
                                      (dir / "ours.pt") + " " + (dir / "theirs.pt"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("loaded scale=256.0 growth_tracker=2 growth_factor=4.0 backoff_factor=0.25 growth_interval=3"));
  const std::string text = testing::read_text(dir / "theirs.pt");
  GradScaler scaler;
  scaler.load_state_dict(torch::pickle_load(std::vector<char>(text.begin(), text.end())).toGenericDict());
  EXPECT_EQ(scaler.get_scale(), 128.0);  // what the script saved
  EXPECT_EQ(scaler.get_growth_tracker(), 5);
  EXPECT_EQ(scaler.get_growth_interval(), 100);
}

// See Note [Inf checks across ranks]. No DDP: each rank has its own gradients, only rank 1's is
// inf; the group makes both skip and both halve the scale.
TEST(GradScaler, GroupMakesEveryRankSkipWhenOneRankOverflows) {
  run_ranks(2, [](int64_t rank, dist::ProcessGroup& group) {
    Tiny t;
    GradScaler scaler(GradScalerOptions().group(&group));
    scaler.scale(t.loss()).backward();
    if (rank == 1) t.model->bias.mutable_grad().fill_(kInf);
    const auto before = t.snapshot();
    EXPECT_FALSE(scaler.step(t.optimizer)) << "rank " << rank;
    scaler.update();
    EXPECT_TRUE(t.unchanged_since(before)) << "rank " << rank;
    EXPECT_EQ(scaler.get_scale(), 32768.0) << "rank " << rank;
  });
}

// Two ranks with DDP; at step 3 rank 1's loss is multiplied by inf. Both ranks skip step 3, keep
// their parameters and halve the scale; the other steps go through and parameters stay equal.
TEST(GradScaler, TwoRanksWithDdpBothSkipTheStepWhereRankOneOverflows) {
  std::vector<std::vector<double>> scales(2);
  std::vector<std::vector<torch::Tensor>> finals(2);
  run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    Tiny t;
    parallel::DistributedDataParallel ddp(t.model.ptr(), group);
    GradScaler scaler(GradScalerOptions().group(&group));
    const auto x = torch::arange(12, torch::kFloat).reshape({4, 3}) / (10 + rank);
    for (int step = 1; step <= 4; ++step) {
      t.optimizer.zero_grad();
      auto loss = ddp.forward(x).pow(2).mean();
      if (step == 3 && rank == 1) loss = loss * kInf;
      scaler.scale(loss).backward();
      const auto before = t.snapshot();
      const bool stepped = scaler.step(t.optimizer);
      scaler.update();
      EXPECT_EQ(stepped, step != 3) << "rank " << rank << " step " << step;
      EXPECT_EQ(t.unchanged_since(before), step == 3) << "rank " << rank << " step " << step;
      scales[rank].push_back(scaler.get_scale());
    }
    finals[rank] = t.snapshot();
  });
  EXPECT_EQ(scales[0], (std::vector<double>{65536, 65536, 32768, 32768}));
  EXPECT_EQ(scales[1], scales[0]);
  for (size_t i = 0; i < finals[0].size(); ++i) EXPECT_TRUE(torch::equal(finals[0][i], finals[1][i])) << i;
}

}  // namespace
}  // namespace lockstep::amp
