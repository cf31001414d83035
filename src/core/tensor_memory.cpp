#include "lockstep/core/tensor_memory.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace lockstep {
namespace {

// See Note [Counting tensor bytes]. One instance, made once and never destroyed, since tensors it
// made may outlive every guard. It wraps the allocator installed when the outermost guard starts
// (c10's, or the caching one: Note [Caching large CPU blocks]) and frees each block with the
// deleter that allocator gave it.
class CountingAllocator final : public c10::Allocator {
 public:
  static CountingAllocator& instance() {
    static CountingAllocator* counting = new CountingAllocator;
    return *counting;
  }

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = inner_->allocate(n);
    TORCH_CHECK(inner.get() == inner.get_context(), "the CPU allocator is not raw-compatible: cannot count tensor bytes");
    const c10::DeleterFnPtr free = inner.get_deleter();
    void* data = inner.release_context();
    const auto bytes = static_cast<int64_t>(n);
    const std::thread::id owner = std::this_thread::get_id();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      allocations_[data] = {bytes, owner, free};
      per_thread_[owner] += bytes;
      live_ += bytes;
      peak_ = std::max(peak_, live_);
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, size_t count) const override { default_copy_data(dest, src, count); }

  void install() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (installs_++ == 0) {
      inner_ = c10::GetCPUAllocator();
      c10::SetCPUAllocator(this);
    }
  }
  void uninstall() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--installs_ == 0) c10::SetCPUAllocator(inner_);
  }
  bool active() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return installs_ > 0;
  }
  int64_t live() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_;
  }
  int64_t thread_live() const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = per_thread_.find(std::this_thread::get_id());
    return it == per_thread_.end() ? 0 : it->second;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = base_ = live_;
  }
  int64_t peak() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_ - base_;
  }

 private:
  struct Allocation {
    int64_t bytes;
    std::thread::id owner;
    c10::DeleterFnPtr free;
  };

  CountingAllocator() = default;

  static void release(void* data) {
    CountingAllocator& self = instance();
    c10::DeleterFnPtr free = nullptr;
    {
      std::lock_guard<std::mutex> lock(self.mutex_);
      const auto it = self.allocations_.find(data);
      if (it != self.allocations_.end()) {
        self.live_ -= it->second.bytes;
        self.per_thread_[it->second.owner] -= it->second.bytes;
        free = it->second.free;
        self.allocations_.erase(it);
      } else {
        free = self.inner_->raw_deleter();
      }
    }
    free(data);
  }

  c10::Allocator* inner_ = c10::GetCPUAllocator();  // replaced at each outermost install
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, Allocation> allocations_;
  mutable std::unordered_map<std::thread::id, int64_t> per_thread_;
  mutable int64_t live_ = 0, peak_ = 0, base_ = 0;
  int64_t installs_ = 0;
};

}  // namespace

TensorMemoryCounter::TensorMemoryCounter() { CountingAllocator::instance().install(); }
TensorMemoryCounter::~TensorMemoryCounter() { CountingAllocator::instance().uninstall(); }

bool TensorMemoryCounter::active() { return CountingAllocator::instance().active(); }
int64_t TensorMemoryCounter::live_bytes() { return CountingAllocator::instance().live(); }
int64_t TensorMemoryCounter::thread_live_bytes() { return CountingAllocator::instance().thread_live(); }
void TensorMemoryCounter::reset_peak() { CountingAllocator::instance().reset_peak(); }
int64_t TensorMemoryCounter::peak_bytes() { return CountingAllocator::instance().peak(); }

}  // namespace lockstep
