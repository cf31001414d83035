#include "lockstep/core/process.h"

#include "lockstep/core/world.h"

#include <c10/util/Exception.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <thread>

namespace lockstep {

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

std::optional<int64_t> env_int(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text, &end, 10);
  TORCH_CHECK_VALUE(end != text && *end == '\0', "environment variable ", name, "='", text,
                    "' is not an integer; unset it or give a whole number");
  TORCH_CHECK_VALUE(errno != ERANGE, "environment variable ", name, "='", text, "' is beyond a 64-bit integer");
  return value;
}

int default_intra_op_threads() {
  const int64_t local = world_from_env().local_world_size;  // checked there: at least 1
  const int cores = available_cores();
  return local >= cores ? 1 : cores / static_cast<int>(local);
}

bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }

}  // namespace lockstep
