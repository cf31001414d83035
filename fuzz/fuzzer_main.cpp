// libFuzzer's entry point for one target, chosen at compile time (LOCKSTEP_FUZZ_ENTRY is one of
// the functions of targets.h; fuzz/CMakeLists.txt builds one executable per function).
#include <cstdio>
#include <cstdlib>

#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    lockstep::fuzz::LOCKSTEP_FUZZ_ENTRY(data, size);
  } catch (const lockstep::fuzz::Violation& v) {
    // An abort is what libFuzzer saves as a crash (crash-<sha1>), with this message in its log.
    std::fprintf(stderr, "lockstep fuzz violation: %s\n", v.what());
    std::abort();
  }
  return 0;
}

// Note [LibTorch's zip reader leaks when its constructor throws]
// caffe2::serialize::PyTorchStreamReader opens its miniz archive in the constructor and closes it
// in the destructor; when a corrupt archive makes the constructor throw (no data.pkl directory,
// no version record), the destructor never runs and ~400 bytes of miniz state leak. It is
// LibTorch's code (uninstrumented, so the leak's stack stops at its first frame), once per corrupt
// file a process is asked to load; LeakSanitizer is told to ignore leaks that LibTorch allocated
// so that the fuzzers keep finding lockstep's own.
extern "C" const char* __lsan_default_suppressions() { return "leak:libtorch_cpu.so\n"; }
