#include "lockstep/train/batch_loader.h"

#include <c10/util/Exception.h>

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

void BatchLoader::work() {
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
