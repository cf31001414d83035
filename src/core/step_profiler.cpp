#include "lockstep/core/step_profiler.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "lockstep/core/atomic_file.h"

namespace lockstep {
namespace {

int64_t ns_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kData: return "data";
    case Phase::kForward: return "forward";
    case Phase::kLoss: return "loss";
    case Phase::kBackward: return "backward";
    case Phase::kSync: return "sync";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kLogging: return "logging";
  }
  TORCH_INTERNAL_ASSERT(false, "phase_name: no name for Phase ", static_cast<int>(phase));
}

StepProfiler::StepProfiler(StepProfilerOptions options) : options_(std::move(options)), origin_(Clock::now()) {
  TORCH_CHECK_VALUE(options_.max_trace_events() >= 0, "StepProfiler: max_trace_events=",
                    options_.max_trace_events(), " must be >= 0 (0 keeps no trace events)");
}

StepProfiler::Scope::Scope(StepProfiler* profiler, Phase phase) : profiler_(profiler), phase_(phase) {
  if (profiler_ == nullptr) return;
  TORCH_CHECK(!profiler_->in_phase_, "StepProfiler: phase '", phase_name(phase),
              "' started while another phase is running; phases do not nest: end the outer scope first");
  profiler_->in_phase_ = true;
  // See Note [Timing asynchronous devices]: work queued before the phase is not its cost.
  if (profiler_->options_.synchronize()) profiler_->options_.synchronize()();
  start_ = Clock::now();
}

StepProfiler::Scope::~Scope() {
  if (profiler_ == nullptr) return;
  if (profiler_->options_.synchronize()) profiler_->options_.synchronize()();
  profiler_->record(phase_, start_, Clock::now());
  profiler_->in_phase_ = false;
}

void StepProfiler::record(Phase phase, Clock::time_point start, Clock::time_point end) {
  if (!in_step_) {
    in_step_ = true;
    step_start_ = start;
  }
  const int64_t dur_ns = ns_between(start, end);
  step_ns_[static_cast<int>(phase)] += dur_ns;
  last_phase_ = phase;
  last_dur_ns_ = dur_ns;
  last_event_kept_ = static_cast<int64_t>(events_.size()) < options_.max_trace_events();
  if (last_event_kept_) {
    events_.push_back({phase, steps_, ns_between(origin_, start), dur_ns});
  } else {
    ++dropped_events_;
  }
}

void StepProfiler::split_tail(Phase to, std::chrono::nanoseconds tail) {
  if (!enabled() || !in_step_ || in_phase_) return;
  const int64_t ns = std::min<int64_t>(std::max<int64_t>(0, tail.count()), last_dur_ns_);
  step_ns_[static_cast<int>(last_phase_)] -= ns;
  step_ns_[static_cast<int>(to)] += ns;
  last_dur_ns_ -= ns;
  if (!last_event_kept_) return;
  Event& from = events_.back();
  from.dur_ns -= ns;
  if (static_cast<int64_t>(events_.size()) < options_.max_trace_events()) {
    events_.push_back({to, steps_, from.start_ns + from.dur_ns, ns});
  } else {
    ++dropped_events_;
  }
  last_event_kept_ = false;  // a second split would take from `to`'s event, not the phase's
}

void StepProfiler::end_step() {
  if (!enabled()) return;
  TORCH_CHECK(!in_phase_, "StepProfiler: end_step() called while a phase is running; "
              "let the phase's scope end first");
  if (!in_step_) return;
  total_step_ns_ += ns_between(step_start_, Clock::now());
  for (int p = 0; p < kNumPhases; ++p) total_ns_[p] += step_ns_[p];
  step_ns_.fill(0);
  in_step_ = false;
  ++steps_;
}

ProfileSummary StepProfiler::summary() const {
  ProfileSummary s;
  s.steps = steps_;
  const double steps = steps_ > 0 ? static_cast<double>(steps_) : 1.0;
  const double step_ns = total_step_ns_ > 0 ? static_cast<double>(total_step_ns_) : 1.0;
  auto row = [&](std::string name, int64_t ns) {
    s.phases.push_back({std::move(name), static_cast<double>(ns) / steps / 1e6, static_cast<double>(ns) / step_ns});
  };
  int64_t phases_ns = 0;
  for (int p = 0; p < kNumPhases; ++p) {
    row(phase_name(static_cast<Phase>(p)), total_ns_[p]);
    phases_ns += total_ns_[p];
  }
  row("other", total_step_ns_ - phases_ns);  // >= 0: phases do not overlap and lie inside steps
  s.step_mean_ms = static_cast<double>(total_step_ns_) / steps / 1e6;
  return s;
}

std::string StepProfiler::report() const {
  const ProfileSummary s = summary();
  char line[96];
  std::snprintf(line, sizeof(line), "%-10s %10s %7s   (%lld steps)\n", "phase", "ms/step", "share",
                static_cast<long long>(s.steps));
  std::string out = line;
  for (const PhaseTime& p : s.phases) {
    std::snprintf(line, sizeof(line), "%-10s %10.3f %6.1f%%\n", p.name.c_str(), p.mean_ms, 100 * p.share);
    out += line;
  }
  std::snprintf(line, sizeof(line), "%-10s %10.3f %6.1f%%\n", "step", s.step_mean_ms, s.steps > 0 ? 100.0 : 0.0);
  return out + line;
}

void StepProfiler::write_chrome_trace(const std::string& path, int64_t rank) const {
  nlohmann::json events = nlohmann::json::array();
  for (const Event& e : events_) {
    events.push_back({{"name", phase_name(e.phase)}, {"ph", "X"},
                      {"ts", static_cast<double>(e.start_ns) / 1e3}, {"dur", static_cast<double>(e.dur_ns) / 1e3},
                      {"pid", rank}, {"tid", 0}, {"args", {{"step", e.step}}}});
  }
  const nlohmann::json trace{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"},
                             {"otherData", {{"dropped_events", dropped_events_}}}};
  const std::string text = trace.dump();
  write_file_atomic(path, std::vector<char>(text.begin(), text.end()));
}

}  // namespace lockstep
