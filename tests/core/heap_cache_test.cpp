// Note [Caching large CPU blocks]: reuse by size class, the bound on what the cache maps, raw
// allocation, frees from other threads, the off switch, and resident memory under a step whose
// large tensors come and go in changing order. Cases that install an allocator for the whole
// process run in a forked child, so the test binary's own allocator is not changed.
#include <c10/core/CPUAllocator.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "../test_util.h"
#include "in_child.h"
#include "lockstep/core/heap.h"
#include "lockstep/core/tensor_memory.h"

namespace lockstep {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

TEST(HeapCache, AFreedBlockServesTheNextRequestOfItsClassWithoutAMapping) {
  CachingCpuAllocator allocator;
  void* first = nullptr;
  {
    c10::DataPtr block = allocator.allocate(3 * kMiB);
    first = block.get();
    std::memset(first, 1, 3 * kMiB);
  }
  c10::DataPtr again = allocator.allocate(3 * kMiB - 4096);  // another size, the same class (3 MiB)
  EXPECT_EQ(again.get(), first);
  const CachingCpuAllocator::Stats s = allocator.stats();
  EXPECT_EQ(s.maps, 1);
  EXPECT_EQ(s.reuses, 1);
  EXPECT_EQ(s.live_bytes, 3 * kMiB);
  EXPECT_EQ(s.cached_bytes, 0);
  c10::DataPtr other = allocator.allocate(4 * kMiB);  // another class maps its own block
  EXPECT_NE(other.get(), first);
  EXPECT_EQ(allocator.stats().maps, 2);
}

TEST(HeapCache, OverTheBoundALargerCachedBlockIsTakenInsteadOfANewMapping) {
  CachingCpuAllocator allocator;
  void* big = nullptr;
  {
    c10::DataPtr block = allocator.allocate(4 * kMiB);  // the high water: 4 MiB, the bound 4.5
    big = block.get();
  }
  c10::DataPtr smaller = allocator.allocate(3 * kMiB);  // a new 3 MiB block would map 7 MiB
  EXPECT_EQ(smaller.get(), big);
  EXPECT_EQ(allocator.stats().maps, 1);
  EXPECT_EQ(allocator.stats().live_bytes, 4 * kMiB);  // the block keeps its size and class
  smaller.clear();
  c10::DataPtr half = allocator.allocate(kMiB + kMiB / 2);  // 4 MiB is more than twice 1.5: unmapped
  EXPECT_EQ(allocator.stats().maps, 2);
  EXPECT_EQ(allocator.stats().unmaps, 1);
}

// Resident pages of [data, data + bytes), by mincore.
int64_t resident_pages(void* data, int64_t bytes) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> in_core(static_cast<size_t>((bytes + page - 1) / page));
  EXPECT_EQ(::mincore(data, static_cast<size_t>(bytes), in_core.data()), 0);
  return std::count_if(in_core.begin(), in_core.end(), [](unsigned char c) { return (c & 1) != 0; });
}

// A larger cached block taken for a smaller request keeps no more resident pages than the request:
// the previous tensor's pages past it go back to the kernel (they held nothing live).
TEST(HeapCache, ALargerBlockTakenForASmallerRequestKeepsOnlyTheRequestsPagesResident) {
  CachingCpuAllocator allocator;
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  void* big = nullptr;
  {
    c10::DataPtr block = allocator.allocate(8 * kMiB);  // the high water: 8 MiB, the bound 9
    big = block.get();
    std::memset(big, 1, 8 * kMiB);
    EXPECT_EQ(resident_pages(big, 8 * kMiB), 8 * kMiB / page);
  }
  c10::DataPtr smaller = allocator.allocate(5 * kMiB);  // a new 5 MiB block would map 13 MiB
  ASSERT_EQ(smaller.get(), big);
  EXPECT_EQ(allocator.stats().trims, 1);
  EXPECT_EQ(resident_pages(big, 8 * kMiB), 5 * kMiB / page);
  std::memset(smaller.get(), 2, 5 * kMiB);
  EXPECT_EQ(static_cast<unsigned char*>(smaller.get())[5 * kMiB - 1], 2);
  smaller.clear();
  c10::DataPtr again = allocator.allocate(8 * kMiB);  // its own class again: the whole block, usable
  ASSERT_EQ(again.get(), big);
  std::memset(again.get(), 3, 8 * kMiB);
  EXPECT_EQ(resident_pages(big, 8 * kMiB), 8 * kMiB / page);
  EXPECT_EQ(allocator.stats().trims, 1);  // an exact class is not trimmed
}

TEST(HeapCache, SizeClassesAreWholePagesAndWasteLessThanAnEighth) {
  CachingCpuAllocator allocator;
  std::vector<int64_t> classes;
  for (int64_t bytes = kMiB; bytes <= 64 * kMiB; bytes += 12345) {
    const int64_t size = allocator.size_class(bytes);
    ASSERT_GE(size, bytes);
    ASSERT_LT(size - bytes, bytes / 8 + 1) << bytes;
    ASSERT_EQ(size % ::sysconf(_SC_PAGESIZE), 0) << bytes;
    classes.push_back(size);
  }
  classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
  EXPECT_EQ(classes.size(), 6 * 8 + 1u);  // 8 per doubling from 1 to 64 MiB, and 64 MiB itself
  EXPECT_EQ(allocator.size_class(1000), ::sysconf(_SC_PAGESIZE));  // below the threshold: pages
}

TEST(HeapCache, BlocksAreAlignedAndRawAllocationsRoundTrip) {
  CachingCpuAllocator allocator(kMiB);
  for (const size_t bytes : {size_t{1}, size_t{100}, size_t{1} << 19, size_t{1} << 20, size_t{5} << 20}) {
    void* data = allocator.raw_allocate(bytes);
    ASSERT_NE(data, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % c10::gAlignment, 0u) << bytes;
    std::memset(data, 7, bytes);
    allocator.raw_deallocate(data);  // small blocks go back to c10's allocator, large to the cache
  }
  const CachingCpuAllocator::Stats s = allocator.stats();
  EXPECT_EQ(s.live_bytes, 0);
  // 1 MiB once live, then 5 MiB: keeping both would pass the bound (9/8 of 5 MiB), so the 1 MiB went.
  EXPECT_EQ(s.cached_bytes, allocator.size_class(5 << 20));
  EXPECT_EQ(s.maps, 2);
  EXPECT_EQ(s.unmaps, 1);
}

TEST(HeapCache, BlocksFreedByOtherThreadsReturnToTheCache) {
  CachingCpuAllocator allocator;
  constexpr int kThreads = 4, kBlocksEach = 16;
  std::vector<c10::DataPtr> blocks;
  for (int i = 0; i < kThreads * kBlocksEach; ++i) blocks.push_back(allocator.allocate((1 + i % 3) * kMiB));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = t * kBlocksEach; i < (t + 1) * kBlocksEach; ++i) blocks[i].clear();  // freed here
      for (int round = 0; round < 50; ++round) {  // and each thread allocates and frees its own
        c10::DataPtr mine = allocator.allocate((1 + (round + t) % 3) * kMiB);
        static_cast<char*>(mine.get())[0] = 1;
      }
    });
  for (auto& thread : threads) thread.join();
  const CachingCpuAllocator::Stats s = allocator.stats();
  EXPECT_EQ(s.live_bytes, 0);
  EXPECT_EQ(s.cached_bytes, s.peak_live_bytes);  // every mapped block is back, none was lost
  EXPECT_EQ(s.maps - s.unmaps, kThreads * kBlocksEach);  // the threads' blocks came from the cache
}

TEST(HeapCache, MappedBlocksStayWithinTheHighWaterOfLiveBlocks) {
  CachingCpuAllocator allocator;
  std::mt19937 random(34);
  std::vector<c10::DataPtr> live;
  for (int step = 0; step < 200; ++step) {
    if (!live.empty() && random() % 3 == 0) live.erase(live.begin() + static_cast<long>(random() % live.size()));
    if (live.size() < 6) live.push_back(allocator.allocate((1 + random() % 24) * kMiB + random() % kMiB));
    const CachingCpuAllocator::Stats s = allocator.stats();
    ASSERT_LE(s.live_bytes + s.cached_bytes, CachingCpuAllocator::bound_bytes(s.peak_live_bytes)) << "step " << step;
    ASSERT_EQ(CachingCpuAllocator::bound_bytes(s.peak_live_bytes), s.peak_live_bytes + s.peak_live_bytes / 8);
  }
  EXPECT_GT(allocator.stats().unmaps, 0) << "the sequence never needed the bound; it tests nothing";
  live.clear();
  allocator.release_cached();
  const CachingCpuAllocator::Stats s = allocator.stats();
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.peak_live_bytes, 0);
  EXPECT_EQ(s.maps, s.unmaps);
}

TEST(HeapCache, TheCounterWrapsTheCachingAllocator) {
  const int64_t counted = testing::in_child([] {
    if (!configure_heap().empty() || CachingCpuAllocator::installed() == nullptr) return int64_t{-1};
    const TensorMemoryCounter counter;
    TensorMemoryCounter::reset_peak();
    { const torch::Tensor t = torch::empty({3 * kMiB}, torch::kUInt8); }
    const torch::Tensor kept = torch::empty({2 * kMiB}, torch::kUInt8);
    const CachingCpuAllocator::Stats s = CachingCpuAllocator::installed()->stats();
    // The counter saw both tensors; the kept one took the freed 3 MiB block (a new one would pass
    // the bound, 9/8 of 3 MiB).
    if (s.live_bytes != 3 * kMiB || s.live_class_bytes != 2 * kMiB || s.cached_bytes != 0) return int64_t{-2};
    return TensorMemoryCounter::peak_bytes();
  });
  EXPECT_EQ(counted, 3 * kMiB);
}

TEST(HeapCache, TheEnvironmentTurnsItOff) {
  const int64_t off = testing::in_child([] {
    ::setenv("LOCKSTEP_CPU_ALLOCATOR", "glibc", 1);
    const std::string why = configure_heap();
    return int64_t{why.find("LOCKSTEP_CPU_ALLOCATOR=glibc") != std::string::npos &&
                   CachingCpuAllocator::installed() == nullptr &&
                   c10::GetCPUAllocator() == c10::GetDefaultCPUAllocator()};
  });
  EXPECT_EQ(off, 1);
  const int64_t on = testing::in_child([] {
    return int64_t{configure_heap().empty() && c10::GetCPUAllocator() == CachingCpuAllocator::installed()};
  });
  EXPECT_EQ(on, 1);
  ::setenv("LOCKSTEP_CPU_ALLOCATOR", "jemalloc", 1);
  EXPECT_THAT(testing::error_message([] { configure_heap(HeapOptions().caching_allocator(false)); }),
              ::testing::HasSubstr("LOCKSTEP_CPU_ALLOCATOR=jemalloc is not a CPU allocator: set it to caching"));
  ::unsetenv("LOCKSTEP_CPU_ALLOCATOR");
}

// In a child: kSteps steps, each allocating tensors of 12-28 MiB (mlp-wide's buckets, all-gather
// outputs and gradients) in a shuffled order and freeing them in another, touching every page;
// two of each step's tensors live on until the next step's end (as gradients do), pinning the
// heap between its holes.
// Returns the growth of resident memory over the run, in KiB, and sets *peak_live to the most
// bytes the tensors held at once.
constexpr int kSteps = 12;
int64_t resident_growth_kib(bool caching, int64_t* peak_live) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const int64_t growth = testing::in_child([caching, fd = fds[1]] {
    if (!configure_heap(HeapOptions().caching_allocator(caching)).empty()) return int64_t{-1};
    const int64_t before = resident_bytes();
    std::mt19937 random(7);
    int64_t live = 0, peak = 0, resident = 0;
    std::vector<torch::Tensor> carried;
    for (int step = 0; step < kSteps; ++step) {
      std::vector<torch::Tensor> tensors;
      for (int i = 0; i < 8; ++i) {
        const int64_t bytes = (12 + static_cast<int64_t>(random() % 17)) * kMiB;
        tensors.push_back(torch::empty({bytes}, torch::kUInt8));
        std::memset(tensors.back().data_ptr(), step, bytes);
        peak = std::max(peak, live += bytes);
        if (random() % 2 == 0) {  // some die young
          const size_t victim = random() % tensors.size();
          live -= tensors[victim].numel();
          tensors.erase(tensors.begin() + static_cast<long>(victim));
        }
        resident = std::max(resident, resident_bytes() - before);
      }
      std::shuffle(tensors.begin(), tensors.end(), random);
      for (auto& t : carried) {
        live -= t.numel();
        t = torch::Tensor();
      }
      carried.assign(tensors.begin(), tensors.begin() + std::min<long>(2, static_cast<long>(tensors.size())));
      for (size_t i = carried.size(); i < tensors.size(); ++i) {
        live -= tensors[i].numel();
        tensors[i] = torch::Tensor();
      }
    }
    if (::write(fd, &peak, sizeof(peak)) != sizeof(peak)) return int64_t{-1};
    return resident / 1024;
  });
  ::close(fds[1]);
  if (::read(fds[0], peak_live, sizeof(*peak_live)) != sizeof(*peak_live)) *peak_live = -1;
  ::close(fds[0]);
  return growth;
}

TEST(HeapCache, ResidentMemoryStaysAtTheLiveHighWaterWhateverTheOrder) {
  int64_t peak_caching = 0, peak_glibc = 0;
  const int64_t caching = resident_growth_kib(true, &peak_caching);
  const int64_t glibc = resident_growth_kib(false, &peak_glibc);
  ASSERT_GT(caching, 0);
  ASSERT_GT(glibc, 0);
  ASSERT_EQ(peak_caching, peak_glibc);  // the same sequence
  const double live_kib = static_cast<double>(peak_caching) / 1024;
  std::printf("resident growth over %d steps, peak live %.0f MiB: caching %.0f MiB, glibc's heap %.0f MiB\n", kSteps,
              live_kib / 1024, caching / 1024.0, glibc / 1024.0);
  // Caching: the mapped blocks stay within an eighth above the live high water in class sizes,
  // which are less than an eighth above the requests: (9/8)^2 = 1.27 (and 2 MiB for the rest).
  EXPECT_LE(static_cast<double>(caching), live_kib * 1.27 + 2048);
  // glibc's heap has no such bound: its figure (1.05-1.33 times the live high water in five runs here) depends
  // on the heap the child inherits from the tests before it, so it is printed, not asserted.
}

}  // namespace
}  // namespace lockstep
