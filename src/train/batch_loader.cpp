#include "lockstep/train/batch_loader.h"

#include <c10/util/Exception.h>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <utility>

namespace lockstep::train {

void LoaderOptions::validate() const {
  TORCH_CHECK_VALUE(workers() >= 0, "loader workers ", workers(), " must be 0 (load on the training thread) or more");
  TORCH_CHECK_VALUE(prefetch() >= 1, "loader prefetch ", prefetch(), " must be at least 1 batch per worker");
}

BatchLoader::BatchLoader(std::shared_ptr<TrainingData> data, LoaderOptions options)
    : data_(std::move(data)), options_(options) {
  options_.validate();
  TORCH_CHECK_VALUE(data_ != nullptr, "BatchLoader: no data");
  for (int64_t w = 0; w < options_.workers(); ++w) threads_.emplace_back([this] { work(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void BatchLoader::start(std::vector<std::vector<int64_t>> batches, int64_t from, int64_t epoch, uint64_t seed) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (batches_) issued_ = static_cast<int64_t>(batches_->size());  // nothing more of the old epoch
  // An epoch left early (an error) may still have batches in the workers' hands: they finish
  // against the data's old epoch before the data moves on.
  batch_ready_.wait(lock, [this] { return busy_ == 0; });
  data_->set_epoch(epoch, seed);
  batches_ = std::make_shared<const std::vector<std::vector<int64_t>>>(std::move(batches));
  next_ = issued_ = std::max<int64_t>(from, 0);
  built_.clear();
  lock.unlock();
  work_ready_.notify_all();
}

Example BatchLoader::next() {
  TORCH_CHECK(batches_ != nullptr && next_ < static_cast<int64_t>(batches_->size()), "BatchLoader::next: batch ",
              next_, " of an epoch of ", batches_ ? batches_->size() : 0, " batches; call start() for the next epoch");
  const int64_t index = next_++;
  if (threads_.empty()) return data_->get_batch((*batches_)[index]);
  std::unique_lock<std::mutex> lock(mutex_);
  batch_ready_.wait(lock, [&] { return built_.count(index) > 0; });
  Built built = std::move(built_.at(index));
  built_.erase(index);
  lock.unlock();
  work_ready_.notify_all();  // the window moved: a worker may take one more
  if (built.error) std::rethrow_exception(built.error);
  return std::move(built.batch);
}

// Note [Workers do not preempt the step]
// A worker sleeps when it is prefetch batches ahead, and the step wakes it each time it takes a
// batch. Under Linux's default policy a woken thread that has slept preempts the thread that woke
// it when they share a core, so the step lost the core inside its data phase for as long as the
// worker built a batch (~2 ms of 64 PNG files): with 2 ranks and 2 workers on 2 cores the data
// phase was 2.3-5.4% of the step in 10 of 10 runs, though the batch was built already. SCHED_BATCH
// (nice unchanged) is for threads that do not need to run at once: its wakeups do not preempt,
// so the worker runs when the step waits (in a collective) or at the next tick. Then the phase
// was 0.1% in 10 of 10 runs, and samples/s rose (docs/benchmarks.md). Best effort: where the
// policy cannot be set, the worker runs as it would have.
void BatchLoader::work() {
  sched_param param{};
  pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
  const int64_t window = options_.workers() * options_.prefetch();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [&] {
      return stop_ || (batches_ && issued_ < static_cast<int64_t>(batches_->size()) && issued_ < next_ + window);
    });
    if (stop_) return;
    const int64_t index = issued_++;
    const auto batches = batches_;  // a start() while this batch is built leaves it valid
    ++busy_;
    lock.unlock();
    Built built;
    try {
      built.batch = data_->get_batch((*batches)[index]);
    } catch (...) {
      built.error = std::current_exception();
    }
    lock.lock();
    --busy_;
    if (batches == batches_) built_.emplace(index, std::move(built));
    batch_ready_.notify_all();
  }
}

}  // namespace lockstep::train
