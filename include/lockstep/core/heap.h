#pragma once

#include <torch/arg.h>

#include <cstdint>
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
struct HeapOptions {
  TORCH_ARG(int64_t, mmap_threshold_bytes) = int64_t{32} << 20;
  TORCH_ARG(int64_t, trim_threshold_bytes) = int64_t{1} << 30;
};

// Sets glibc malloc's thresholds (see the Note) once for this process. Returns "" when it set them,
// else why it did not (the environment sets them, or glibc refused a value). Call it early, before
// the large allocations of training; a training loop calls it from its first line.
std::string configure_heap(const HeapOptions& options = {});

}  // namespace lockstep
