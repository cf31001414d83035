#include "lockstep/core/step_profiler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "../test_util.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;

// Busy-waits, so the time is spent on the CPU like real work and never ends early.
void spin(double ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(ms);
  while (std::chrono::steady_clock::now() < end) {
  }
}

// What the test itself measures around the profiled code: mean ms per step.
struct Bracket {
  double forward_ms = 0;
  double backward_ms = 0;
  double step_ms = 0;
};

// forward 2 ms, 1 ms of unprofiled work, backward 6 ms, per step.
Bracket run_steps(StepProfiler& profiler, int steps) {
  using Clock = std::chrono::steady_clock;
  auto mean_ms = [steps](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count() / steps; };
  Bracket b;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = Clock::now();
    {
      auto s = profiler.scope(Phase::kForward);
      spin(2);
    }
    const auto t1 = Clock::now();
    spin(1);
    const auto t2 = Clock::now();
    {
      auto s = profiler.scope(Phase::kBackward);
      spin(6);
    }
    const auto t3 = Clock::now();
    profiler.end_step();
    b.forward_ms += mean_ms(t1 - t0);
    b.backward_ms += mean_ms(t3 - t2);
    b.step_ms += mean_ms(Clock::now() - t0);
  }
  return b;
}

const PhaseTime& row(const ProfileSummary& s, const std::string& name) {
  for (const PhaseTime& p : s.phases) {
    if (p.name == name) return p;
  }
  throw std::runtime_error("no row " + name);
}

// A phase lasts at least its busy-wait and at most what the test measured around its scope, both
// exactly (one monotonic clock): preemption on a shared machine moves both, so no tolerance needed.
void expect_mean_between(const ProfileSummary& s, const std::string& name, double low_ms, double high_ms) {
  const double mean = row(s, name).mean_ms;
  EXPECT_GE(mean, low_ms) << name;
  EXPECT_LE(mean, high_ms) << name;
}

TEST(StepProfiler, MeansMatchBusyWaitsAndUnprofiledTimeIsOther) {
  StepProfiler profiler;
  const Bracket b = run_steps(profiler, 20);
  profiler.end_step();  // no phase ran: not a step
  const ProfileSummary s = profiler.summary();
  EXPECT_EQ(s.steps, 20);
  ASSERT_EQ(s.phases.size(), static_cast<size_t>(kNumPhases) + 1);
  expect_mean_between(s, "forward", 2, b.forward_ms);
  expect_mean_between(s, "backward", 6, b.backward_ms);
  expect_mean_between(s, "other", 1, b.step_ms - 8);
  expect_mean_between(s, "data", 0, 0);
  EXPECT_GE(s.step_mean_ms, 9);
  EXPECT_LE(s.step_mean_ms, b.step_ms);
  // Shares against the test's own clock: backward is at least its 6 ms busy-wait of a step that
  // took at most b.step_ms, and at most b.backward_ms of a step of at least 9 ms; "other" likewise.
  EXPECT_GE(row(s, "backward").share, 6 / b.step_ms);
  EXPECT_LE(row(s, "backward").share, b.backward_ms / 9);
  EXPECT_GE(row(s, "other").share, 1 / b.step_ms);
  EXPECT_LE(row(s, "other").share, (b.step_ms - 8) / 9);

  const std::string report = profiler.report();
  EXPECT_THAT(report, HasSubstr("(20 steps)"));
  EXPECT_THAT(report, HasSubstr("backward"));
  EXPECT_THAT(report, HasSubstr("other"));
  EXPECT_THAT(report, HasSubstr("100.0%"));
}

TEST(StepProfiler, ChromeTraceHasOneEventPerPhaseWithoutOverlapInAStep) {
  StepProfiler profiler;
  const std::vector<Phase> order{Phase::kData, Phase::kForward, Phase::kLoss, Phase::kBackward,
                                 Phase::kSync, Phase::kOptimizer, Phase::kLogging};
  for (int step = 0; step < 3; ++step) {
    for (Phase p : order) {
      auto s = profiler.scope(p);
      spin(0.2);
    }
    profiler.end_step();
  }
  testing::TempDir dir;
  profiler.write_chrome_trace(dir / "trace.json", 3);
  const auto trace = nlohmann::json::parse(testing::read_text(dir / "trace.json"));
  EXPECT_EQ(trace["displayTimeUnit"], "ms");
  EXPECT_EQ(trace["otherData"]["dropped_events"], 0);
  const auto& events = trace["traceEvents"];
  ASSERT_EQ(events.size(), 3 * order.size());
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    EXPECT_EQ(e["name"], phase_name(order[i % order.size()]));
    EXPECT_EQ(e["ph"], "X");
    EXPECT_EQ(e["pid"], 3);
    EXPECT_EQ(e["tid"], 0);
    EXPECT_EQ(e["args"]["step"], static_cast<int64_t>(i / order.size()));
    EXPECT_GE(e["ts"].get<double>(), 0);
    EXPECT_GE(e["dur"].get<double>(), 200);  // microseconds
    if (i % order.size() != 0) {
      const auto& previous = events[i - 1];
      EXPECT_LE(previous["ts"].get<double>() + previous["dur"].get<double>(), e["ts"].get<double>()) << i;
    }
  }
}

TEST(StepProfiler, KeepsFirstTraceEventsOnlyButMeansUseEveryStep) {
  StepProfiler profiler(StepProfilerOptions().max_trace_events(3));
  run_steps(profiler, 4);
  testing::TempDir dir;
  profiler.write_chrome_trace(dir / "trace.json", 0);
  const auto trace = nlohmann::json::parse(testing::read_text(dir / "trace.json"));
  EXPECT_EQ(trace["traceEvents"].size(), 3u);
  EXPECT_EQ(trace["otherData"]["dropped_events"], 5);
  EXPECT_EQ(profiler.summary().steps, 4);
  // The first 3 events hold one backward phase; 6 ms per step needs all 4.
  EXPECT_GE(row(profiler.summary(), "backward").mean_ms, 6);
}

TEST(StepProfiler, DisabledRecordsNothingAndNeverSynchronizes) {
  int syncs = 0;
  StepProfiler profiler(StepProfilerOptions().enabled(false).synchronize([&] { ++syncs; }));
  run_steps(profiler, 2);
  const ProfileSummary s = profiler.summary();
  EXPECT_EQ(s.steps, 0);
  EXPECT_EQ(s.step_mean_ms, 0);
  for (const PhaseTime& p : s.phases) EXPECT_EQ(p.mean_ms, 0) << p.name;
  EXPECT_EQ(syncs, 0);
  testing::TempDir dir;
  profiler.write_chrome_trace(dir / "trace.json", 0);
  EXPECT_TRUE(nlohmann::json::parse(testing::read_text(dir / "trace.json"))["traceEvents"].empty());
}

TEST(StepProfiler, SynchronizeHookRunsAtEveryPhaseStartAndEnd) {
  int syncs = 0;
  StepProfiler profiler(StepProfilerOptions().synchronize([&] { ++syncs; }));
  run_steps(profiler, 3);
  EXPECT_EQ(syncs, 3 * 2 * 2);  // 3 steps x 2 phases x (start, end)
}

TEST(StepProfiler, RejectsNestedPhasesAndEndStepInsideAPhase) {
  StepProfiler profiler;
  auto outer = profiler.scope(Phase::kBackward);
  EXPECT_THAT(testing::error_message([&] { auto inner = profiler.scope(Phase::kSync); }),
              HasSubstr("phase 'sync' started while another phase is running"));
  EXPECT_THAT(testing::error_message([&] { profiler.end_step(); }),
              HasSubstr("end_step() called while a phase is running"));
  EXPECT_THAT(testing::error_message([] { StepProfiler p(StepProfilerOptions().max_trace_events(-1)); }),
              HasSubstr("max_trace_events=-1 must be >= 0"));
}

}  // namespace
}  // namespace lockstep

namespace lockstep {
namespace {

// backward spins 3 ms; its last 1 ms is declared a sync wait: 2 ms backward + 1 ms sync, and the
// trace shows sync starting where the shortened backward ends.
TEST(StepProfiler, SplitTailMovesTheEndOfAPhaseToAnother) {
  StepProfiler profiler;
  for (int step = 0; step < 2; ++step) {
    {
      auto s = profiler.scope(Phase::kBackward);
      spin(3.0);
    }
    profiler.split_tail(Phase::kSync, std::chrono::milliseconds(1));
    profiler.end_step();
  }
  const ProfileSummary s = profiler.summary();
  const double backward = s.phases[static_cast<int>(Phase::kBackward)].mean_ms;
  EXPECT_EQ(s.phases[static_cast<int>(Phase::kSync)].mean_ms, 1.0);  // exactly what was split off
  EXPECT_GE(backward, 2.0);
  testing::TempDir dir;
  profiler.write_chrome_trace(dir / "t.json", 0);
  const auto events = nlohmann::json::parse(testing::read_text(dir / "t.json"))["traceEvents"];
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[1]["name"], "sync");
  EXPECT_EQ(events[1]["dur"].get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(events[0]["ts"].get<double>() + events[0]["dur"].get<double>(), events[1]["ts"].get<double>());

  // More than the phase lasted is clamped to it; nothing happens outside a step.
  StepProfiler clamp;
  {
    auto s = clamp.scope(Phase::kBackward);
    spin(0.5);
  }
  clamp.split_tail(Phase::kSync, std::chrono::seconds(1));
  clamp.end_step();
  EXPECT_EQ(clamp.summary().phases[static_cast<int>(Phase::kBackward)].mean_ms, 0.0);
  clamp.split_tail(Phase::kSync, std::chrono::seconds(1));
  EXPECT_EQ(clamp.summary().steps, 1);
}

}  // namespace
}  // namespace lockstep
