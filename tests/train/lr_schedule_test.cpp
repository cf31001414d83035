#include "lockstep/train/lr_schedule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "lockstep/core/names.h"

namespace lockstep::train {
namespace {

using ::testing::HasSubstr;

struct Case {
  LrScheduleOptions options;
  int64_t steps;  // lrs compared: lr_at(0) .. lr_at(steps - 1)
};

nlohmann::json to_json(const Case& c) {
  const LrScheduleOptions& o = c.options;
  return {{"kind", enum_name(lr_schedule_names(), o.kind())},         {"base_lr", o.base_lr()},     {"total_steps", o.total_steps()},
          {"step_size", o.step_size()}, {"gamma", o.gamma()},       {"milestones", o.milestones()},
          {"eta_min", o.eta_min()},   {"warmup_steps", o.warmup_steps()}, {"steps", c.steps}};
}

// Every kind with and without warmup, against torch.optim.lr_scheduler stepped once per optimizer
// step (tests/python/lr_schedules.py). Tolerance 1e-12 relative (plus 1e-15 x base_lr for lrs near
// 0), not exact: PyTorch computes most steps with its chainable formulas, each lr from the previous
// one, whose rounding drifts from our closed forms (by at most 1.3e-15 relative over the 3000-step
// cosine case with torch 1.13.1).
TEST(LrSchedule, ProducesPyTorchLrs_AllKindsWithAndWithoutWarmup) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  const std::vector<Case> cases{
      {LrScheduleOptions(0.1), 5},
      {LrScheduleOptions(0.1).warmup_steps(4), 8},
      {LrScheduleOptions(0.1).warmup_steps(1), 3},
      {LrScheduleOptions(0.1).kind(LrScheduleKind::kStep).step_size(3).gamma(0.5), 11},
      {LrScheduleOptions(0.4).kind(LrScheduleKind::kStep).step_size(3).gamma(0.5).warmup_steps(2), 12},
      {LrScheduleOptions(0.1).kind(LrScheduleKind::kMultiStep).milestones({2, 5, 9}), 12},
      {LrScheduleOptions(0.1).kind(LrScheduleKind::kMultiStep).milestones({1, 4}).gamma(0.3).warmup_steps(3), 10},
      {LrScheduleOptions(0.1).kind(LrScheduleKind::kCosine).total_steps(20).eta_min(0.001), 21},
      {LrScheduleOptions(0.05).kind(LrScheduleKind::kCosine).total_steps(20).warmup_steps(5), 21},
      {LrScheduleOptions(0.2).kind(LrScheduleKind::kCosine).total_steps(3000).warmup_steps(100).eta_min(1e-4), 3001},
  };
  nlohmann::json spec = nlohmann::json::array();
  for (const Case& c : cases) spec.push_back(to_json(c));
  auto r = testing::run_command(python + " " LOCKSTEP_SOURCE_DIR "/tests/python/lr_schedules.py '" +
                                spec.dump() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto theirs = nlohmann::json::parse(testing::last_json_line(r.output))["lrs"];
  ASSERT_EQ(theirs.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const LrSchedule schedule(cases[i].options);
    const auto expected = theirs[i].get<std::vector<double>>();
    ASSERT_EQ(static_cast<int64_t>(expected.size()), cases[i].steps);
    const double base_lr = cases[i].options.base_lr();
    for (int64_t t = 0; t < cases[i].steps; ++t) {
      const double tol = 1e-12 * std::abs(expected[t]) + 1e-15 * base_lr;
      ASSERT_NEAR(schedule.lr_at(t), expected[t], tol) << "case " << to_json(cases[i]) << " step " << t;
    }
  }
}

// Closed forms at a few points, so the shape is checked even where python3-torch is missing.
TEST(LrSchedule, WarmupRisesLinearlyToBaseLrThenMainScheduleStartsFromItsStepZero) {
  const LrSchedule s(LrScheduleOptions(0.3).kind(LrScheduleKind::kStep).step_size(2).gamma(0.1).warmup_steps(3));
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);         // base_lr / W
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.3 * (1.0 / 3 + 2.0 / 9));
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.3);         // warmup over; step_size counts from here
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.3);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.03);
}

TEST(LrSchedule, CosineReachesEtaMinAtTotalStepsAndStaysThere) {
  const LrSchedule s(LrScheduleOptions(0.1).kind(LrScheduleKind::kCosine).total_steps(10).warmup_steps(2).eta_min(0.01));
  EXPECT_DOUBLE_EQ(s.lr_at(2), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(6), 0.055);  // half way: (base_lr + eta_min) / 2
  for (int64_t t : {10, 11, 100}) EXPECT_DOUBLE_EQ(s.lr_at(t), 0.01) << "step " << t;
}

TEST(LrSchedule, ApplySetsLrInEveryParamGroupOfAnyOptimizer) {
  const LrSchedule s(LrScheduleOptions(0.1).kind(LrScheduleKind::kMultiStep).milestones({2}));
  auto a = torch::zeros({2}, torch::requires_grad());
  auto b = torch::zeros({3}, torch::requires_grad());
  torch::optim::SGD sgd({torch::optim::OptimizerParamGroup({a}), torch::optim::OptimizerParamGroup({b})},
                        torch::optim::SGDOptions(1.0).momentum(0.9));
  torch::optim::Adam adam({a, b}, torch::optim::AdamOptions(1.0));
  s.apply(sgd, 2);
  s.apply(adam, 2);
  ASSERT_EQ(sgd.param_groups().size(), 2u);
  for (const auto& group : sgd.param_groups()) EXPECT_DOUBLE_EQ(group.options().get_lr(), 0.01);
  EXPECT_DOUBLE_EQ(adam.param_groups()[0].options().get_lr(), 0.01);
  EXPECT_DOUBLE_EQ(static_cast<const torch::optim::SGDOptions&>(sgd.param_groups()[0].options()).momentum(), 0.9);
}

TEST(LrSchedule, RejectsInvalidOptionsNamingTheValueAndTheFix) {
  auto message = [](const LrScheduleOptions& o) { return testing::error_message([&] { LrSchedule s(o); }); };
  EXPECT_THAT(testing::error_message([] { enum_from_name<LrScheduleKind>(lr_schedule_names(), "linear", "lr schedule"); }),
              HasSubstr("unknown lr schedule 'linear'; choose constant, step, multistep, cosine"));
  EXPECT_THAT(message(LrScheduleOptions(-1)), HasSubstr("base_lr=-1 must be a finite number >= 0"));
  EXPECT_THAT(message(LrScheduleOptions(0.1).warmup_steps(-5)), HasSubstr("warmup_steps=-5 must be >= 0"));
  EXPECT_THAT(message(LrScheduleOptions(0.1).kind(LrScheduleKind::kStep)), HasSubstr("step_size=0 must be >= 1"));
  EXPECT_THAT(message(LrScheduleOptions(0.1).kind(LrScheduleKind::kStep).step_size(5).gamma(0)), HasSubstr("gamma=0 must be > 0"));
  EXPECT_THAT(message(LrScheduleOptions(0.1).kind(LrScheduleKind::kMultiStep)), HasSubstr("needs milestones"));
  EXPECT_THAT(message(LrScheduleOptions(0.1).kind(LrScheduleKind::kMultiStep).milestones({5, 5})),
              HasSubstr("milestones[1]=5 must be >= 1 and greater than the milestone before it"));
  EXPECT_THAT(message(LrScheduleOptions(0.1).kind(LrScheduleKind::kMultiStep).milestones({0, 3})), HasSubstr("milestones[0]=0"));
  EXPECT_THAT(message(LrScheduleOptions(0.1).kind(LrScheduleKind::kCosine)),
              HasSubstr("needs total_steps (the run's optimizer steps, warmup included) > warmup_steps=0, got total_steps=0"));
  EXPECT_THAT(message(LrScheduleOptions(0.1).kind(LrScheduleKind::kCosine).total_steps(10).warmup_steps(10)),
              HasSubstr("> warmup_steps=10, got total_steps=10"));
  EXPECT_THAT(message(LrScheduleOptions(0.1).kind(LrScheduleKind::kCosine).total_steps(10).eta_min(-0.1)),
              HasSubstr("eta_min=-0.1 must be"));
  EXPECT_THAT(testing::error_message([] { LrSchedule(LrScheduleOptions(0.1)).lr_at(-1); }),
              HasSubstr("step=-1 must be >= 0"));
  // Options another kind uses are not checked.
  EXPECT_EQ(message(LrScheduleOptions(0.1).kind(LrScheduleKind::kConstant).step_size(-3).gamma(-1)), "<no error>");
}

TEST(LrSchedule, ScaleLrAppliesLinearSqrtOrNoRule) {
  EXPECT_DOUBLE_EQ(scale_lr(0.1, LrScaleRule::kLinear, 8), 0.8);
  EXPECT_DOUBLE_EQ(scale_lr(0.1, LrScaleRule::kSqrt, 16), 0.4);
  EXPECT_DOUBLE_EQ(scale_lr(0.1, LrScaleRule::kNone, 16), 0.1);
  EXPECT_DOUBLE_EQ(scale_lr(0.1, LrScaleRule::kLinear, 1), 0.1);
  EXPECT_THAT(testing::error_message([] { enum_from_name<LrScaleRule>(lr_scale_rule_names(), "cubic", "--scale-lr rule"); }),
              HasSubstr("unknown --scale-lr rule 'cubic'; choose none, linear, sqrt"));
  EXPECT_THAT(testing::error_message([] { scale_lr(0.1, LrScaleRule::kLinear, 0); }), HasSubstr("factor=0 must be at least 1"));
}

}  // namespace
}  // namespace lockstep::train
