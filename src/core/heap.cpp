#include "lockstep/core/heap.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "lockstep/core/tensor_memory.h"

namespace lockstep {
namespace {

// The environment variable that already sets a threshold, or nullptr.
const char* set_by_environment() {
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"})
    if (std::getenv(name) != nullptr) return name;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr &&
      (std::strstr(tunables, "malloc.mmap_threshold") != nullptr || std::strstr(tunables, "malloc.trim_threshold") != nullptr))
    return "GLIBC_TUNABLES";
  return nullptr;
}

std::string set_glibc_thresholds(const HeapOptions& options) {
  if (const char* name = set_by_environment()) return c10::str(name, " sets glibc's malloc thresholds already");
  // The trim threshold first: setting either one ends glibc's own adjustment of both.
  if (mallopt(M_TRIM_THRESHOLD, static_cast<int>(options.trim_threshold_bytes())) != 1)
    return c10::str("glibc refused M_TRIM_THRESHOLD=", options.trim_threshold_bytes());
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(options.mmap_threshold_bytes())) != 1)
    return c10::str("glibc refused M_MMAP_THRESHOLD=", options.mmap_threshold_bytes());
  return "";
}

// See Note [Caching large CPU blocks]: every instance's live large blocks, by address, under one
// mutex that also guards the instances' free lists.
struct LiveBlock {
  const CachingCpuAllocator* owner;  // nullptr once its allocator is gone: unmapped when freed
  int64_t size;                      // mapped
  int64_t wanted;                    // the class asked for (size, or less in a larger block)
};
// Held across fork(), so that a child never inherits it locked by a thread it does not have.
std::mutex& blocks_mutex() {
  static auto* mutex = [] {
    auto* m = new std::mutex;
    ::pthread_atfork([] { blocks_mutex().lock(); }, [] { blocks_mutex().unlock(); }, [] { blocks_mutex().unlock(); });
    return m;
  }();
  return *mutex;
}
std::unordered_map<void*, LiveBlock>& live_blocks() {
  static auto* blocks = new std::unordered_map<void*, LiveBlock>;
  return *blocks;
}

std::atomic<CachingCpuAllocator*> g_installed{nullptr};

const int64_t kPageBytes = ::sysconf(_SC_PAGESIZE);

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

void* map_block(int64_t size) {
  void* data = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return data == MAP_FAILED ? nullptr : data;
}

// "" when installed (now or before), else why not. See Note [Caching large CPU blocks].
std::string install_caching_allocator(const HeapOptions& options) {
  const char* choice = std::getenv("LOCKSTEP_CPU_ALLOCATOR");
  const std::string name = choice == nullptr ? "" : choice;
  TORCH_CHECK_VALUE(name.empty() || name == "caching" || name == "glibc", "LOCKSTEP_CPU_ALLOCATOR=", name,
                    " is not a CPU allocator: set it to caching (the default) or glibc, or unset it");
  if (name == "glibc") return "LOCKSTEP_CPU_ALLOCATOR=glibc keeps LibTorch's CPU allocator";
  if (!options.caching_allocator() || CachingCpuAllocator::installed() != nullptr) return "";
  // Installed under a counter, it would be dropped when the counter uninstalls (it restores what it wrapped).
  if (TensorMemoryCounter::active()) return "a TensorMemoryCounter is installed: call configure_heap() before it";
  auto* allocator = new CachingCpuAllocator(options.large_block_bytes());  // lives as long as its tensors: forever
  c10::SetCPUAllocator(allocator, /*priority=*/0);
  g_installed.store(allocator);
  return "";
}

}  // namespace

// See Note [Keeping freed memory for the next step] and Note [Caching large CPU blocks].
std::string configure_heap(const HeapOptions& options) {
  TORCH_CHECK_VALUE(options.mmap_threshold_bytes() > 0 && options.mmap_threshold_bytes() <= (int64_t{32} << 20),
                    "HeapOptions: mmap_threshold_bytes=", options.mmap_threshold_bytes(),
                    " must be in (0, 32 MiB], glibc's range");
  TORCH_CHECK_VALUE(options.trim_threshold_bytes() > 0 && options.trim_threshold_bytes() <= INT_MAX,
                    "HeapOptions: trim_threshold_bytes=", options.trim_threshold_bytes(),
                    " must be in (0, 2 GiB), the range of mallopt's int");
  const std::string caching = install_caching_allocator(options);  // first: it may refuse the environment
  const std::string glibc = set_glibc_thresholds(options);
  return glibc.empty() || caching.empty() ? glibc + caching : glibc + "; " + caching;
}

CachingCpuAllocator::CachingCpuAllocator(int64_t large_block_bytes) : large_block_bytes_(large_block_bytes) {
  TORCH_CHECK_VALUE(large_block_bytes >= 8 * kPageBytes, "CachingCpuAllocator: large_block_bytes=", large_block_bytes,
                    " must be at least ", 8 * kPageBytes, " (8 pages, so that a size class is whole pages)");
}

CachingCpuAllocator::~CachingCpuAllocator() {
  release_cached();
  std::lock_guard<std::mutex> lock(blocks_mutex());
  for (auto& [data, block] : live_blocks())
    if (block.owner == this) block.owner = nullptr;
}

CachingCpuAllocator* CachingCpuAllocator::installed() { return g_installed.load(); }

int64_t CachingCpuAllocator::bound_bytes(int64_t peak_live_bytes) { return peak_live_bytes + peak_live_bytes / 8; }

int64_t CachingCpuAllocator::size_class(int64_t bytes) const {
  if (bytes < large_block_bytes_) return round_up(std::max<int64_t>(bytes, 1), kPageBytes);
  int64_t power = 1;
  while (power * 2 <= bytes) power *= 2;
  return round_up(bytes, std::max(power / 8, kPageBytes));
}

c10::DataPtr CachingCpuAllocator::allocate(size_t bytes) {
  if (static_cast<int64_t>(bytes) < large_block_bytes_) return c10::GetDefaultCPUAllocator()->allocate(bytes);
  void* data = take(size_class(static_cast<int64_t>(bytes)), static_cast<int64_t>(bytes));
  return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
}

c10::DeleterFnPtr CachingCpuAllocator::raw_deleter() const { return &release; }

void CachingCpuAllocator::release(void* data) {
  std::unique_lock<std::mutex> lock(blocks_mutex());
  const auto it = live_blocks().find(data);
  if (it == live_blocks().end()) {  // a small block (or one allocated before the install)
    lock.unlock();
    c10::GetDefaultCPUAllocator()->raw_deleter()(data);
    return;
  }
  const LiveBlock block = it->second;
  live_blocks().erase(it);
  if (block.owner == nullptr)
    ::munmap(data, static_cast<size_t>(block.size));
  else
    block.owner->give_back(data, block.size, block.wanted);
}

void* CachingCpuAllocator::take(int64_t wanted, int64_t request) const {
  std::lock_guard<std::mutex> lock(blocks_mutex());
  void* data = nullptr;
  int64_t size = wanted;
  // Its class, else (when a new block would pass the bound) the smallest cached one up to twice it.
  const int64_t limit = bound_bytes(stats_.peak_live_bytes);
  auto cached = free_.find(wanted);
  if (cached == free_.end() && stats_.live_bytes + stats_.cached_bytes + wanted > limit) {
    cached = free_.upper_bound(wanted);
    if (cached != free_.end() && cached->first > 2 * wanted) cached = free_.end();
  }
  if (cached != free_.end()) {
    size = cached->first;
    data = cached->second.back().data;
    cached->second.pop_back();
    if (cached->second.empty()) free_.erase(cached);
    stats_.cached_bytes -= size;
    ++stats_.reuses;
    if (size > wanted) {
      // A larger block: the pages past the request go back to the kernel (see the Note).
      const int64_t keep = round_up(request, kPageBytes);
      ::madvise(static_cast<char*>(data) + keep, static_cast<size_t>(size - keep), MADV_DONTNEED);
      ++stats_.trims;
    }
  } else {
    // The bound on live + cached, this block included.
    const int64_t bound = std::max(limit, bound_bytes(stats_.live_class_bytes + wanted));
    while (stats_.live_bytes + stats_.cached_bytes + size > bound && unmap_oldest()) {}
    data = map_block(size);
    if (data == nullptr) {  // the cache's pages may be what the kernel is missing
      while (unmap_oldest()) {}
      data = map_block(size);
    }
    TORCH_CHECK(data != nullptr, "CachingCpuAllocator: the kernel refused ", size, " bytes for a tensor (", errno,
                ": ", std::strerror(errno), ") with ", stats_.live_bytes,
                " bytes live in large blocks: out of memory; a smaller batch or a sharding strategy needs less");
    ++stats_.maps;
  }
  stats_.live_bytes += size;
  stats_.live_class_bytes += wanted;
  stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_class_bytes);
  live_blocks()[data] = {this, size, wanted};
  return data;
}

void CachingCpuAllocator::give_back(void* data, int64_t size, int64_t wanted) const {  // under blocks_mutex()
  free_[size].push_back({data, frees_++});
  stats_.live_bytes -= size;
  stats_.live_class_bytes -= wanted;
  stats_.cached_bytes += size;
}

bool CachingCpuAllocator::unmap_oldest() const {  // under blocks_mutex()
  auto oldest = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if (oldest == free_.end() || it->second.front().freed < oldest->second.front().freed) oldest = it;
  if (oldest == free_.end()) return false;
  ::munmap(oldest->second.front().data, static_cast<size_t>(oldest->first));
  stats_.cached_bytes -= oldest->first;
  ++stats_.unmaps;
  oldest->second.pop_front();
  if (oldest->second.empty()) free_.erase(oldest);
  return true;
}

CachingCpuAllocator::Stats CachingCpuAllocator::stats() const {
  std::lock_guard<std::mutex> lock(blocks_mutex());
  return stats_;
}

void CachingCpuAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(blocks_mutex());
  while (unmap_oldest()) {}
  stats_.peak_live_bytes = stats_.live_class_bytes;
}

}  // namespace lockstep
