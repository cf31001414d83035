#pragma once

#include <c10/core/Allocator.h>
#include <torch/arg.h>

#include <cstdint>
#include <deque>
#include <map>
#include <string>

namespace lockstep {

// Note [Keeping freed memory for the next step]
// A training step allocates the same large tensors every step (activations, their gradients: for
// convnet at batch 100, several of 2.5-5 MB) and frees them before the next. LibTorch takes CPU
// memory from glibc's malloc, whose defaults adapt as the process runs: a block above the mmap
// threshold gets pages of its own from the kernel and returns them on free, and the threshold rises
// to the largest such block freed so far; the heap gives memory back to the kernel whenever more
// than twice that threshold lies free at its top. Which of these a step's tensors meet depends on
// what else was allocated where, so a run can flip between reusing its memory and asking the
// kernel for fresh zeroed pages every step. Seen here: `lockstep train --model convnet --profile`
// on 60,000 samples took 1.17 million page faults and ran 16-18% slower than without --profile
// (70 thousand faults), though all --profile adds to a step is a few clock reads and a growing
// list of events; at 12,000 samples the same two runs faulted alike.
//
// configure_heap() fixes both thresholds for the whole process: blocks up to 32 MiB (glibc's
// largest mmap threshold) come from the heap and stay there when freed, and the heap keeps up to
// 1 GiB free at its top. A process's resident memory then stays at its peak instead of dropping
// between steps; the peak itself does not change. It is what the allocators PyTorch users preload
// for CPU training (jemalloc, tcmalloc) do by design. glibc reads the same settings from
// MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ and GLIBC_TUNABLES: when any of them names
// either threshold, configure_heap() leaves the heap as the user set it. Under a preloaded
// allocator it changes nothing, as glibc's malloc is then not the one in use.
//
// Large blocks no longer rely on it: see Note [Caching large CPU blocks].
struct HeapOptions {
  TORCH_ARG(int64_t, mmap_threshold_bytes) = int64_t{32} << 20;
  TORCH_ARG(int64_t, trim_threshold_bytes) = int64_t{1} << 30;
  // Install CachingCpuAllocator as LibTorch's CPU allocator (off, or LOCKSTEP_CPU_ALLOCATOR=glibc:
  // every tensor from glibc as before).
  TORCH_ARG(bool, caching_allocator) = true;
  TORCH_ARG(int64_t, large_block_bytes) = int64_t{128} << 10;  // the smallest block it caches
};

// Sets glibc malloc's thresholds (see the Note) once for this process and installs the caching
// allocator. Returns "" when it did both, else why not, "; "-separated (the environment sets the
// thresholds, glibc refused a value, LOCKSTEP_CPU_ALLOCATOR=glibc). Call it early, before the large
// allocations of training and before other threads start; a training loop calls it first.
// Throws c10::ValueError for an unknown LOCKSTEP_CPU_ALLOCATOR.
std::string configure_heap(const HeapOptions& options = {});

// Note [Caching large CPU blocks]
// configure_heap()'s thresholds keep a step's freed memory, but glibc's heap serves a request only
// from a hole it fits: steps that allocate 12-28 MiB blocks in changing order (a bucket, an
// all-gather's output, the gradients) left holes no later request used, and the heap grew past the
// live high water by an amount that changed from run to run (mlp-wide zero2, rank 0: 428, 456 and
// 535 MiB in three runs, 129 MiB in use). Memory that depends on the order of frees cannot be
// planned. CachingCpuAllocator does for CPU tensors what PyTorch's CUDA caching allocator does for
// GPU memory:
// - A block of large_block_bytes (128 KiB) or more is its own mmap, its size rounded up to a size
//   class: 8 classes per power of two (128, 144, ..., 240 KiB, 256, 288, ... KiB), so a class
//   wastes less than 1/8 of the request, and varying shapes (gpt-mini's bucketed text batches) map
//   to few classes. 128 KiB is glibc's own default mmap threshold, the size from which glibc
//   would give a block pages of its own had configure_heap() not raised it: below it glibc's heap
//   serves blocks well; from 1 MiB (the threshold until 2026-11-27) glibc's arenas kept the
//   step's freed 128 KiB-1 MiB blocks as holes that count in the resident set: gpt-mini's
//   activations (0.1-1 MiB) under ddp at bf16 O1, 25-42 MiB free beside 77 MiB in use at the
//   peak; convnet's micro-batches of 25 rows (0.6 MiB activations) on the pipeline's first stage,
//   21 MiB free beside 44 (docs/memory-plan.md). Only touched pages are resident, so what the
//   kernel counts is the request rounded to pages unless a larger request of the class used the
//   block before.
// - A freed block goes to its class's free list; the next request of that class takes the most
//   recently freed one: no syscall, no page fault, so a step's repeated shapes cost the kernel
//   nothing after the first step, as under configure_heap().
// - The bound: the blocks mapped (live and cached) never exceed the largest total of live classes
//   seen so far (peak_live_bytes) plus an eighth (bound_bytes()). A request its class cannot
//   serve maps a new block only under that bound; over it, it takes the smallest cached block of
//   a larger class up to twice its own (pages already resident: no fault, no syscall), and only
//   when there is none are the least recently freed cached blocks unmapped first. The high water
//   counts the class asked for, not the larger block, so taking larger blocks cannot raise the
//   bound step after step; while such blocks are live, mapped memory can pass the bound by their
//   extra size, never by more. The taken block's pages past the request are given back
//   (madvise MADV_DONTNEED: the mapping stays, the pages go; a later larger use faults them in
//   again): they held the previous, larger tensor and nothing now, but were resident. Without
//   that, blocks up to twice their tensors made up to a quarter of the large blocks at a step's
//   peak (two ranks of mlp-wide, ddp at bf16 O2: 200 MiB mapped and resident for 151.5 MiB of live
//   classes; fsdp at O1: 159 for 136). So the resident memory of large blocks is the high water of
//   live large tensors (in classes), at most an eighth more, whatever the order of frees, and that
//   is what a plan computes (Note [Planning memory]). With
//   no slack and no larger blocks, a step whose gradients come in other classes than the
//   activations they replace unmapped and faulted in again every step (convnet at batch 100: six
//   2.5 MiB blocks and others each step, 7 times the page faults of glibc's heap).
//   release_cached() gives back every cached block and restarts the high water (after a dry run).
// - Smaller blocks go to c10's default allocator (glibc, 64-byte aligned), whose heap serves
//   them well. Blocks are page aligned (c10 needs 64). The DataPtr's context is its data, so
//   raw_allocate/raw_deallocate work (oneDNN uses them) and TensorMemoryCounter wraps it.
// - One mutex guards the lists and the table of live large blocks: any thread may free (Gloo's,
//   the data loader's, shared-memory workers'). The deleter finds a block's allocator through that
//   table, so several instances (tests) coexist; an address it does not hold is a small block.
// It is installed with priority 0, the priority c10 registers its own allocator with, so that
// TensorMemoryCounter, installed later with the same priority, still wraps it.
class CachingCpuAllocator final : public c10::Allocator {
 public:
  struct Stats {
    int64_t live_bytes = 0;        // large blocks in use (their mapped sizes)
    int64_t live_class_bytes = 0;  // the classes asked for by those (less, for larger blocks taken)
    int64_t cached_bytes = 0;      // large blocks freed and kept
    int64_t peak_live_bytes = 0;   // the most live_class_bytes at once; bound_bytes() of it: the bound
    int64_t maps = 0, unmaps = 0, reuses = 0;
    int64_t trims = 0;  // larger cached blocks taken, their pages past the request given back
  };

  explicit CachingCpuAllocator(int64_t large_block_bytes = int64_t{128} << 10);
  ~CachingCpuAllocator() override;
  CachingCpuAllocator(const CachingCpuAllocator&) = delete;
  CachingCpuAllocator& operator=(const CachingCpuAllocator&) = delete;

  c10::DataPtr allocate(size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, size_t count) const override { default_copy_data(dest, src, count); }

  // The bytes a large block of `bytes` maps (its class); `bytes` rounded to pages below the threshold.
  int64_t size_class(int64_t bytes) const;
  Stats stats() const;
  // Unmaps every cached block; the high water restarts at the live bytes.
  void release_cached();

  // What live + cached may reach when peak_live_bytes have been live at once.
  static int64_t bound_bytes(int64_t peak_live_bytes);
  // The instance configure_heap() installed, or nullptr.
  static CachingCpuAllocator* installed();

 private:
  struct FreeBlock {
    void* data;
    uint64_t freed;  // the order of frees, for unmapping the least recently freed first
  };
  static void release(void* data);  // the deleter of every block it hands out
  // A block of class `wanted` for `request` bytes.
  void* take(int64_t wanted, int64_t request) const;
  void give_back(void* data, int64_t size, int64_t wanted) const;
  bool unmap_oldest() const;

  int64_t large_block_bytes_;
  mutable std::map<int64_t, std::deque<FreeBlock>> free_;  // by class size
  mutable Stats stats_;
  mutable uint64_t frees_ = 0;
};

}  // namespace lockstep
