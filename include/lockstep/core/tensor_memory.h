#pragma once

#include <cstdint>

namespace lockstep {

// Note [Counting tensor bytes]
// The bytes held in CPU tensors, counted by an allocator that wraps LibTorch's CPU allocator
// (every CPU tensor's storage comes from it): exact, and free of what peak RSS also counts (the
// process's code, the data set, memory glibc keeps after a free). oneDNN's own workspaces are not
// tensors and are not counted. Each allocation is also charged to the thread that made it until
// it is freed (by whichever thread), so ranks run as threads of one test, or a pipeline stage
// timing its own forward, read their own bytes. The wrapper is raw-compatible (a DataPtr's context
// is its data, as oneDNN's raw_allocate requires) and keeps sizes by address under one mutex: a
// map insert per allocation, so it is installed only to measure (lockstep train --report-memory,
// tests), never by default.

// Installs the counting allocator while it lives; guards nest (the outermost uninstalls). Tensors
// it counted may outlive it: their frees are still counted. Not for several threads at once.
class TensorMemoryCounter {
 public:
  TensorMemoryCounter();
  ~TensorMemoryCounter();
  TensorMemoryCounter(const TensorMemoryCounter&) = delete;
  TensorMemoryCounter& operator=(const TensorMemoryCounter&) = delete;

  // Whether a counter is installed now.
  static bool active();
  // Bytes in CPU tensors allocated while a counter was installed and not freed yet: all threads'.
  static int64_t live_bytes();
  // Of those, the ones the calling thread allocated.
  static int64_t thread_live_bytes();
  // Starts a measurement: peak_bytes() is the most live_bytes() from now on, above its value now.
  static void reset_peak();
  static int64_t peak_bytes();
};

}  // namespace lockstep
