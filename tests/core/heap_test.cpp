// Note [Keeping freed memory for the next step]: a step's worth of large blocks, freed and taken
// again, costs the kernel's page faults every step under glibc's defaults and once after
// configure_heap(). Each case runs in a forked child, so the heap it changes is not the test's.
#include "lockstep/core/heap.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../test_util.h"
#include "in_child.h"

namespace lockstep {
namespace {

constexpr int64_t kBlocks = 24;
constexpr size_t kBlockBytes = size_t{3} << 20;  // 72 MiB a "step": more than twice glibc's largest mmap threshold
constexpr int kSteps = 10;

// In a child: optionally configure_heap(), then kSteps rounds of allocating, touching and freeing
// kBlocks blocks. Returns the minor page faults of rounds 2..kSteps (the first faults in any case),
// or -1 if configure_heap() declined.
long faults_of_repeated_steps(bool configure) {
  return static_cast<long>(testing::in_child([configure]() -> int64_t {
    if (configure && !configure_heap(HeapOptions().caching_allocator(false)).empty()) return -1;
    void* primer = std::malloc(size_t{8} << 20);  // freed from its own pages: glibc's threshold rises to 8 MiB
    std::memset(primer, 1, size_t{8} << 20);
    std::free(primer);
    rusage before{};
    for (int step = 0; step < kSteps; ++step) {
      if (step == 1) ::getrusage(RUSAGE_SELF, &before);
      std::vector<void*> blocks;
      for (int64_t b = 0; b < kBlocks; ++b) {
        blocks.push_back(std::malloc(kBlockBytes));
        std::memset(blocks.back(), static_cast<int>(step + b), kBlockBytes);
      }
      for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) std::free(*it);
    }
    rusage after{};
    ::getrusage(RUSAGE_SELF, &after);
    return after.ru_minflt - before.ru_minflt;
  }));
}

TEST(Heap, FreedStepMemoryIsReusedInsteadOfFaultedInAgain) {
  const long pages = static_cast<long>((kSteps - 1) * kBlocks * kBlockBytes / static_cast<size_t>(::sysconf(_SC_PAGESIZE)));
  const long defaults = faults_of_repeated_steps(false);
  const long configured = faults_of_repeated_steps(true);
  std::printf("page faults after the first step, of %ld pages touched: glibc's defaults %ld, configured %ld\n", pages,
              defaults, configured);
  // The control: glibc's defaults give the heap back between steps, so most pages fault again.
  EXPECT_GT(defaults, pages / 2) << "glibc's defaults no longer trim this pattern; the test shows nothing";
  ASSERT_GE(configured, 0) << "configure_heap() declined";
  EXPECT_LT(configured, pages / 50) << "of " << pages << " pages touched after the first step";
}

TEST(Heap, TheEnvironmentsSettingIsLeftAlone) {
  const HeapOptions glibc_only = HeapOptions().caching_allocator(false);  // this process keeps its allocator
  ::setenv("MALLOC_TRIM_THRESHOLD_", "131072", 1);
  EXPECT_THAT(configure_heap(glibc_only), ::testing::HasSubstr("MALLOC_TRIM_THRESHOLD_ sets glibc's malloc thresholds"));
  ::unsetenv("MALLOC_TRIM_THRESHOLD_");
  ::setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536", 1);
  EXPECT_THAT(configure_heap(glibc_only), ::testing::HasSubstr("GLIBC_TUNABLES sets"));
  ::unsetenv("GLIBC_TUNABLES");
}

TEST(Heap, ValuesOutsideGlibcsRangeAreRefused) {
  EXPECT_THAT(testing::error_message([] { configure_heap(HeapOptions().mmap_threshold_bytes(int64_t{64} << 20)); }),
              ::testing::HasSubstr("mmap_threshold_bytes=67108864 must be in (0, 32 MiB]"));
  EXPECT_THAT(testing::error_message([] { configure_heap(HeapOptions().trim_threshold_bytes(0)); }),
              ::testing::HasSubstr("trim_threshold_bytes=0 must be in (0, 2 GiB)"));
}

}  // namespace
}  // namespace lockstep
