#include "stall_watch.h"

#include <algorithm>

namespace lockstep::launch {

StallWatch::StallWatch(std::chrono::milliseconds tick) : tick_(tick) {
  thread_ = std::thread([this] {
    auto last = std::chrono::steady_clock::now();
    while (!stop_.load()) {
      std::this_thread::sleep_for(tick_);
      const auto now = std::chrono::steady_clock::now();
      const int64_t gap = std::chrono::duration_cast<std::chrono::milliseconds>(now - last - tick_).count();
      int64_t longest = longest_ms_.load();
      while (gap > longest && !longest_ms_.compare_exchange_weak(longest, gap)) {
      }
      last = now;
    }
  });
}

StallWatch::~StallWatch() {
  stop_.store(true);
  thread_.join();
}

std::chrono::milliseconds StallWatch::take_longest_gap() { return std::chrono::milliseconds(longest_ms_.exchange(0)); }

}  // namespace lockstep::launch
