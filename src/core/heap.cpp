#include "lockstep/core/heap.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <malloc.h>

#include <climits>
#include <cstdlib>
#include <cstring>

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

}  // namespace

// See Note [Keeping freed memory for the next step].
std::string configure_heap(const HeapOptions& options) {
  TORCH_CHECK_VALUE(options.mmap_threshold_bytes() > 0 && options.mmap_threshold_bytes() <= (int64_t{32} << 20),
                    "HeapOptions: mmap_threshold_bytes=", options.mmap_threshold_bytes(),
                    " must be in (0, 32 MiB], glibc's range");
  TORCH_CHECK_VALUE(options.trim_threshold_bytes() > 0 && options.trim_threshold_bytes() <= INT_MAX,
                    "HeapOptions: trim_threshold_bytes=", options.trim_threshold_bytes(),
                    " must be in (0, 2 GiB), the range of mallopt's int");
  if (const char* name = set_by_environment()) return c10::str(name, " sets glibc's malloc thresholds already");
  // The trim threshold first: setting either one ends glibc's own adjustment of both.
  if (mallopt(M_TRIM_THRESHOLD, static_cast<int>(options.trim_threshold_bytes())) != 1)
    return c10::str("glibc refused M_TRIM_THRESHOLD=", options.trim_threshold_bytes());
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(options.mmap_threshold_bytes())) != 1)
    return c10::str("glibc refused M_MMAP_THRESHOLD=", options.mmap_threshold_bytes());
  return "";
}

}  // namespace lockstep
