// See Note [Collectives through shared memory] in shm_collectives.cpp.
#include "shm_segment.h"

#include <c10/util/StringUtil.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <vector>

namespace lockstep::dist {
namespace {

std::string read_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Ranks with the same identity share memory, see each other's process ids and share a network
// stack (see Note [Hosts]); "" means this rank cannot tell. A hostname alone is not enough:
// containers and cloned machines repeat them. The calling thread's namespaces, not the process's:
// a thread may have entered another network namespace (setns), and its sockets live there.
std::string host_identity() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "";
  const std::string boot = read_line("/proc/sys/kernel/random/boot_id");
  std::string identity = std::string(host) + " " + boot;
  for (const char* ns : {"ipc", "pid", "net"}) {
    std::error_code error;
    const auto link = std::filesystem::read_symlink(std::string("/proc/thread-self/ns/") + ns, error);
    if (error) return "";
    identity += " " + link.string();
  }
  return boot.empty() ? "" : identity;
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// Tests find a process's segments by the prefix /lockstep-<pid>-.
std::string unique_name() {
  static std::atomic<uint64_t> made{0};
  std::random_device entropy;
  return c10::str("/lockstep-", ::getpid(), "-", made++, "-", entropy());
}

}  // namespace

ShmSegment::ShmSegment(int64_t size)
    : size_(size),
      control_((kShmLine * static_cast<size_t>(1 + size) + 4095) / 4096 * 4096),
      bytes_(control_ + static_cast<size_t>(size + 1) * static_cast<size_t>(kSlotBytes)),
      base_(MAP_FAILED) {}

ShmSegment::~ShmSegment() {
  if (base_ != MAP_FAILED) ::munmap(base_, bytes_);
}

std::string ShmSegment::map(const std::string& name, bool create) {
  const int fd = ::shm_open(name.c_str(), create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
  if (fd < 0) return c10::str("shm_open(", name, "): ", std::strerror(errno));
  struct stat st {};
  std::string why;
  if (create && ::ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
    why = c10::str("ftruncate(", name, ", ", bytes_, "): ", std::strerror(errno));
  } else if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes_) {
    why = c10::str(name, " has ", st.st_size, " bytes, not ", bytes_);
  } else {
    // Populated now: the first collective should not page-fault its way through the slots.
    base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base_ == MAP_FAILED) why = c10::str("mmap(", name, ", ", bytes_, " bytes): ", std::strerror(errno));
  }
  ::close(fd);
  if (create && !why.empty()) ::shm_unlink(name.c_str());
  return why;
}

bool HostMap::shares_memory() const {
  return all_want_shared_memory && host_of_rank.size() >= 2 &&
         std::all_of(host_of_rank.begin(), host_of_rank.end(), [](int64_t h) { return h == 0; });
}

bool wants_shared_memory(SharedMemory mode) {
  const char* env = std::getenv("LOCKSTEP_SHM");
  return mode == SharedMemory::kAuto && !(env != nullptr && std::string(env) == "0");
}

HostMap exchange_hosts(c10d::Store& store, int64_t rank, int64_t size, SharedMemory mode) {
  const bool wanted = wants_shared_memory(mode);
  const auto key = [](const char* what, int64_t r) { return c10::str("lockstep/host/", what, "/", r); };
  HostMap map;
  if (size == 1) {
    map.host_of_rank = {0};
    return map;
  }
  // Every rank decides from the same values, so all take the same path. A rank that cannot tell
  // its identity is a host of its own.
  const std::string mine = host_identity();
  store.set(key("id", rank), bytes(mine.empty() ? "?" + std::to_string(rank) : mine));
  store.set(key("shm", rank), bytes(wanted ? "1" : "0"));
  std::vector<std::string> seen;
  map.all_want_shared_memory = true;
  for (int64_t r = 0; r < size; ++r) {
    const std::string id = text(store.get(key("id", r)));
    const auto at = std::find(seen.begin(), seen.end(), id);
    map.host_of_rank.push_back(at - seen.begin());
    if (at == seen.end()) seen.push_back(id);
    map.all_want_shared_memory = text(store.get(key("shm", r))) == "1" && map.all_want_shared_memory;
  }
  return map;
}

std::unique_ptr<ShmSegment> ShmSegment::open(c10d::Store& store, int64_t rank, int64_t size) {
  const auto key = [](const char* what, int64_t r) { return c10::str("lockstep/shm/", what, "/", r); };
  std::unique_ptr<ShmSegment> segment(new ShmSegment(size));
  std::string name, why;
  if (rank == 0) {
    name = unique_name();
    why = segment->map(name, /*create=*/true);
    if (why.empty()) {
      new (&segment->group()) ShmGroupLine{};
      for (int64_t r = 0; r < size; ++r) new (&segment->line(r)) ShmRankLine{};
    }
    store.set("lockstep/shm/name", bytes(why.empty() ? name : ""));
  } else {
    name = text(store.get("lockstep/shm/name"));
    why = name.empty() ? "rank 0 could not create it" : segment->map(name, /*create=*/false);
  }
  if (why.empty()) segment->line(rank).pid = static_cast<int32_t>(::getpid());
  store.set(key("mapped", rank), bytes(why.empty() ? "1" : "0"));
  bool all_mapped = true;
  for (int64_t r = 0; r < size; ++r) all_mapped = text(store.get(key("mapped", r))) == "1" && all_mapped;
  if (rank == 0) {
    if (why.empty()) ::shm_unlink(name.c_str());
    store.set("lockstep/shm/unlinked", bytes("1"));
  } else {
    store.get("lockstep/shm/unlinked");  // the group exists only once the name is gone
  }
  if (!all_mapped) return nullptr;
  return segment;
}

}  // namespace lockstep::dist
