#pragma once

#include <torch/arg.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lockstep {

// The parts of one training step, in the order a step runs them.
enum class Phase {
  kData,       // fetching and collating the batch
  kForward,
  kLoss,
  kBackward,   // includes gradient communication DDP overlaps with it
  kSync,       // waiting on other ranks: the gradient all-reduce after backward, a pipeline
               // neighbour's activations or gradients
  kOptimizer,
  kLogging,
};
constexpr int kNumPhases = 7;

const char* phase_name(Phase phase);  // "data", "forward", ...

struct StepProfilerOptions {
  TORCH_ARG(bool, enabled) = true;
  // Events kept for write_chrome_trace: the first ones only, so memory stays bounded (10000 events,
  // about 1400 steps of 7 phases, ~0.3 MiB). The means in summary() use every step.
  TORCH_ARG(int64_t, max_trace_events) = 10000;
  // Called at the start and end of every phase when set. See Note [Timing asynchronous devices].
  TORCH_ARG(std::function<void()>, synchronize);
};

struct PhaseTime {
  std::string name;     // phase_name(), or "other": step time inside no phase
  double mean_ms = 0;   // per step
  double share = 0;     // fraction of the mean step time
};

struct ProfileSummary {
  int64_t steps = 0;             // completed steps
  double step_mean_ms = 0;       // wall time per step
  std::vector<PhaseTime> phases; // every Phase in enum order, then "other"; shares sum to 1
};

// Note [Timing asynchronous devices]
// On CPU every op has finished when it returns, so a phase's wall time is its cost. A CUDA op only
// queues work: without a device synchronisation at phase boundaries, time would land in whichever
// later phase first waits for the device (typically sync or optimizer). A CUDA build sets
// `synchronize` (e.g. to torch::cuda::synchronize) to attribute time correctly, at the price of the
// overlap it removes; the CPU trainer leaves it unset.
//
// Per-phase wall times of training steps. A step runs from the start of its first phase to
// end_step(), so time between phases (unprofiled code) shows as "other", and time between steps
// (evaluation, checkpoints) is not counted. Phases do not nest. Not thread-safe: time one training
// loop, from the thread that runs it.
class StepProfiler {
  using Clock = std::chrono::steady_clock;

 public:
  explicit StepProfiler(StepProfilerOptions options = {});

  // Times one phase of the current step until the guard dies. A disabled profiler reads no clock.
  class Scope {
   public:
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    friend class StepProfiler;
    Scope(StepProfiler* profiler, Phase phase);
    StepProfiler* profiler_;  // null when disabled
    Phase phase_;
    Clock::time_point start_;
  };
  [[nodiscard]] Scope scope(Phase phase) { return Scope(enabled() ? this : nullptr, phase); }

  // Closes the current step; a step in which no phase ran is not counted.
  void end_step();

  // Gives the last `tail` of the phase that just ended to `to`: for work that runs at the end of
  // another phase and cannot have its own scope (DDP's final gradient wait runs inside backward).
  // Clamped to the ended phase's duration; does nothing when disabled or no phase ran this step.
  void split_tail(Phase to, std::chrono::nanoseconds tail);

  bool enabled() const { return options_.enabled(); }
  ProfileSummary summary() const;

  // summary() as a table: phase, mean ms per step, share of step time in %.
  std::string report() const;

  // The kept events in Chrome's Trace Event Format (chrome://tracing, ui.perfetto.dev): one
  // complete ("X") event per phase, ts and dur in microseconds since the profiler was made,
  // pid = rank, args.step = 0-based step. Written atomically.
  void write_chrome_trace(const std::string& path, int64_t rank) const;

 private:
  struct Event {
    Phase phase;
    int64_t step;
    int64_t start_ns;  // since origin_
    int64_t dur_ns;
  };
  void record(Phase phase, Clock::time_point start, Clock::time_point end);

  StepProfilerOptions options_;
  Clock::time_point origin_;
  bool in_phase_ = false;
  bool in_step_ = false;                    // a phase ran since the last end_step()
  Phase last_phase_ = Phase::kData;         // the phase that ended last in this step, and its length
  int64_t last_dur_ns_ = 0;
  bool last_event_kept_ = false;            // it is events_.back()
  Clock::time_point step_start_;
  std::array<int64_t, kNumPhases> step_ns_{};   // the current step's time per phase
  std::array<int64_t, kNumPhases> total_ns_{};  // completed steps' time per phase
  int64_t total_step_ns_ = 0;
  int64_t steps_ = 0;
  std::vector<Event> events_;
  int64_t dropped_events_ = 0;
};

}  // namespace lockstep
