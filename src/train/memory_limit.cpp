#include "lockstep/train/memory_limit.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "lockstep/core/process.h"

namespace lockstep::train {
namespace {

// v1 reports "no limit" as LONG_MAX rounded down to a page; anything this large is no limit.
constexpr int64_t kUnlimited = int64_t{1} << 62;

struct Limit {
  int64_t bytes;
  std::string file;
};

std::optional<std::string> read_first_line(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  std::getline(in, line);
  return line;
}

// A limit file's value: nullopt for "max" or a v1 unlimited value; throws naming the file when
// the text is neither.
std::optional<int64_t> parse_limit(const std::string& text, const std::string& path) {
  if (text == "max") return std::nullopt;
  size_t used = 0;
  int64_t value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::logic_error&) {
    used = 0;
  }
  TORCH_CHECK_VALUE(used > 0 && used == text.size() && value >= 0, "memory limit file '", path, "' holds '", text,
                    "', which is neither a byte count nor 'max'");
  if (value >= kUnlimited) return std::nullopt;
  return value;
}

// The smallest limit in `file` from `dir` (a cgroup's path under `mount`) up to the mount's root.
std::optional<Limit> smallest_limit(const std::string& mount, std::string dir, const std::string& file) {
  std::optional<Limit> best;
  while (true) {
    const std::string path = mount + (dir == "/" ? "" : dir) + "/" + file;
    if (const auto text = read_first_line(path)) {
      const auto bytes = parse_limit(*text, path);
      if (bytes && (!best || *bytes < best->bytes)) best = Limit{*bytes, path};
    }
    if (dir.empty() || dir == "/") break;
    const size_t slash = dir.rfind('/');
    dir = slash == 0 || slash == std::string::npos ? "/" : dir.substr(0, slash);
  }
  return best;
}

// The cgroup limit of this process: v2 ("0::/path", memory.max, at the root or under unified/),
// else v1 ("N:memory:/path", memory.limit_in_bytes under memory/).
std::optional<Limit> cgroup_limit(const MemoryLimitOptions& o, std::string* version) {
  std::ifstream in(o.proc_self_cgroup());
  std::string line;
  std::string v2_path, v1_path;
  while (std::getline(in, line)) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (line.compare(0, first, "0") == 0 && controllers.empty()) v2_path = path;
    std::stringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');)
      if (c == "memory") v1_path = path;
  }
  if (!v2_path.empty()) {
    for (const std::string& mount : {o.cgroup_root(), o.cgroup_root() + "/unified"}) {
      if (auto limit = smallest_limit(mount, v2_path, "memory.max")) {
        *version = "cgroup v2";
        return limit;
      }
    }
  }
  if (!v1_path.empty()) {
    if (auto limit = smallest_limit(o.cgroup_root() + "/memory", v1_path, "memory.limit_in_bytes")) {
      *version = "cgroup v1";
      return limit;
    }
  }
  return std::nullopt;
}

// MemAvailable of a /proc/meminfo, in bytes.
int64_t mem_available(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK_VALUE(in.good(), "cannot read '", path, "' for the memory available to the run");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  TORCH_CHECK_VALUE(false, "'", path, "' has no MemAvailable line (Linux 3.14 or later writes one)");
}

}  // namespace

std::string format_mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", static_cast<double>(bytes) / kMiB);
  return text;
}

int64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  in >> size >> resident;  // in pages
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

// See Note [Memory available to a rank].
MemoryLimit available_memory(const MemoryLimitOptions& o) {
  TORCH_CHECK_VALUE(o.local_ranks() >= 1, "MemoryLimitOptions::local_ranks ", o.local_ranks(), " must be at least 1");
  const std::string ranks = o.local_ranks() == 1 ? "" : c10::str(" / ", o.local_ranks(), " local ranks");
  std::string version;
  if (const auto limit = cgroup_limit(o, &version)) {
    return {limit->bytes / o.local_ranks(),
            c10::str(version, " ", limit->file, " = ", format_mib(limit->bytes), " MiB", ranks)};
  }
  const int64_t available = mem_available(o.meminfo());
  const int64_t held = o.resident_bytes() >= 0 ? o.resident_bytes() : resident_bytes();
  return {available / o.local_ranks() + held,
          c10::str("MemAvailable in ", o.meminfo(), " = ", format_mib(available), " MiB", ranks, ", plus the ",
                   format_mib(held), " MiB this process holds")};
}

}  // namespace lockstep::train
