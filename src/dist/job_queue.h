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

  // Waits for the next job; false once stop() was called and every job was taken. The worker
  // calls it again only when its last job is done, so calling it ends the worker's turn.
  bool pop(Job& job) {
    std::unique_lock<std::mutex> lock(mutex_);
    running_ = false;
    ready_.wait(lock, [&] { return !claimed_ && (stopping_ || !jobs_.empty()); });
    if (jobs_.empty()) return false;
    job = std::move(jobs_.front());
    jobs_.pop_front();
    running_ = true;
    return true;
  }

  // For a caller that would only wait for its job: true when no job is queued or running, and then
  // the caller runs `job` itself (numbered as push would) and calls release() when it is done; the
  // worker takes nothing meanwhile. False: push it. See Note [Collectives on the calling thread].
  bool try_claim(Job& job, uint64_t Job::*number = nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (claimed_ || running_ || !jobs_.empty()) return false;
    claimed_ = true;
    ++pushed_;
    if (number != nullptr) job.*number = pushed_;
    return true;
  }

  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      claimed_ = false;
    }
    ready_.notify_one();
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
  bool running_ = false;  // the worker is in a job
  bool claimed_ = false;  // a caller is in one (try_claim)
};

}  // namespace lockstep::dist
