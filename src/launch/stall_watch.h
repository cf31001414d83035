#pragma once
// Internal to src/launch: how a launcher learns that it was itself stopped. See Note [A launcher
// that was stopped] (launcher.cpp).

#include <atomic>
#include <chrono>
#include <thread>

namespace lockstep::launch {

// A thread that wakes every `tick` and records the longest time between two of its wakings. A
// stopped process (SIGSTOP, a debugger, a paused VM) stops all its threads, so a long gap means the
// whole launcher did not run; a main thread merely blocked in a store request to a stopped peer
// leaves the watch ticking.
class StallWatch {
 public:
  explicit StallWatch(std::chrono::milliseconds tick = std::chrono::milliseconds(100));
  ~StallWatch();
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  // The longest time the watch did not run since the last call, beyond its tick; then starts over.
  std::chrono::milliseconds take_longest_gap();

 private:
  std::chrono::milliseconds tick_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> longest_ms_{0};
  std::thread thread_;
};

}  // namespace lockstep::launch
