#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <string>

namespace lockstep::train {

// Note [Memory available to a rank]
// What one rank of a run may use before the kernel kills it: the memory limit of the process's
// cgroup when it has one (cgroup v2's memory.max, or v1's memory.limit_in_bytes on hosts that
// still mount the v1 memory controller), the smallest along the path from the process's cgroup
// to the root, since a parent's limit caps its children. Ranks started on one host by one
// launcher share their cgroup, so each gets the limit divided by the local ranks. Without a
// limit, the host's MemAvailable (free memory plus what the kernel can reclaim) divided by the
// local ranks, plus what this process already holds (MemAvailable no longer counts it). A v1
// "unlimited" (a page-rounded 2^63) and v2's "max" mean no limit.
struct MemoryLimitOptions {
  TORCH_ARG(int64_t, local_ranks) = 1;  // processes on this host that share the memory
  // Where the kernel's files are; tests point them at fixture files.
  TORCH_ARG(std::string, proc_self_cgroup) = "/proc/self/cgroup";
  TORCH_ARG(std::string, cgroup_root) = "/sys/fs/cgroup";
  TORCH_ARG(std::string, meminfo) = "/proc/meminfo";
  // Bytes this process holds now (its resident set); -1: read /proc/self/statm.
  TORCH_ARG(int64_t, resident_bytes) = -1;
};

struct MemoryLimit {
  int64_t bytes = 0;   // one rank's share
  std::string source;  // where it came from, e.g. "cgroup v2 /sys/fs/cgroup/job/memory.max = 512.0 MiB / 2 ranks"
};

// See Note [Memory available to a rank]. Throws c10::ValueError naming the file when a limit or
// /proc/meminfo cannot be read or parsed, and when local_ranks < 1.
MemoryLimit available_memory(const MemoryLimitOptions& options = {});

// `bytes` in MiB with one decimal ("177.5"), as plans and limits print them.
std::string format_mib(int64_t bytes);

// This process's resident set now, in bytes (/proc/self/statm); what peak_rss_mib() is the
// maximum of.
int64_t resident_bytes();

}  // namespace lockstep::train
