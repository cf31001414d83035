#pragma once
// The queue between a group's callers and its worker thread (ShmCollectives, HierarchicalAllReduce):
// jobs run in issue order, one at a time. Internal to src/dist.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>

namespace lockstep::dist {

template <typename Job>
class JobQueue {
 public:
  // Appends `job`; with `number`, first numbers it 1, 2, ... under the lock, so that the numbers
  // follow the order the worker sees.
  void push(Job job, uint64_t Job::*number = nullptr) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++pushed_;
      if (number != nullptr) job.*number = pushed_;
      jobs_.push_back(std::move(job));
    }
    ready_.notify_one();
  }

  // Waits for the next job; false once stop() was called and every job was taken.
  bool pop(Job& job) {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return false;
    job = std::move(jobs_.front());
    jobs_.pop_front();
    return true;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Job> jobs_;
  uint64_t pushed_ = 0;
  bool stopping_ = false;
};

}  // namespace lockstep::dist
