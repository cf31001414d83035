#pragma once
// The shared-memory segment of one group's intra-host all-reduce: how ranks find out that they
// share a host, and how the segment is made, mapped and unlinked. The algorithm that uses it is in
// shm_collectives.cpp; see Note [Collectives through shared memory] there.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/dist/process_group.h"

namespace lockstep::dist {

constexpr size_t kShmLine = 128;  // two cache lines: the adjacent-line prefetcher moves pairs

static_assert(std::atomic<uint32_t>::is_always_lock_free && sizeof(std::atomic<uint32_t>) == 4,
              "futex needs a lock-free 32-bit word");

struct alignas(kShmLine) ShmGroupLine {
  std::atomic<uint32_t> abandoned;  // 1 + the first rank that gave up or left; 0 while healthy
};

struct alignas(kShmLine) ShmRankLine {
  std::atomic<uint32_t> stage;    // steps this rank announced (see Note [Collectives through shared memory])
  std::atomic<uint32_t> waiters;  // threads of other ranks asleep on `stage`
  std::atomic<uint64_t> seq;      // the collective this rank is in; with numel, root and dtype, for the shape check
  int64_t numel;
  int64_t root;                   // a broadcast's source rank, or -1
  int32_t kind;                   // ShmCollectives::Kind of the collective
  int32_t dtype;
  int32_t pid;
};

// Where every rank of the group behind `store` runs (see Note [Hosts] in process_group.h), and
// whether every rank wants shared memory (`mode`, and LOCKSTEP_SHM not 0). Collective: every rank
// calls it once, when the group is made, and all get the same answer.
struct HostMap {
  std::vector<int64_t> host_of_rank;  // hosts numbered in the order of their lowest rank
  bool all_want_shared_memory = false;
  // Every rank on one host, and all of them want it: what ShmSegment::open needs.
  bool shares_memory() const;
};
HostMap exchange_hosts(c10d::Store& store, int64_t rank, int64_t size, SharedMemory mode);

// Layout: a control area (a line for the group, one per rank, so that ranks never write each
// other's cache lines), then one slot of kSlotBytes per rank, then a result slot of that size.
class ShmSegment {
 public:
  // A tensor larger than a slot travels in chunks of it.
  static constexpr int64_t kSlotBytes = int64_t{2} << 20;

  // Collective over the group behind `store`, whose ranks share memory (HostMap::shares_memory):
  // nullptr on every rank unless all mapped the segment. When it returns on any rank, the segment's
  // name is gone from /dev/shm: a crash leaves nothing behind.
  static std::unique_ptr<ShmSegment> open(c10d::Store& store, int64_t rank, int64_t size);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  ShmGroupLine& group() { return *static_cast<ShmGroupLine*>(base_); }
  ShmRankLine& line(int64_t r) {
    return *reinterpret_cast<ShmRankLine*>(static_cast<char*>(base_) + kShmLine * static_cast<size_t>(1 + r));
  }
  char* slot(int64_t r) { return static_cast<char*>(base_) + control_ + static_cast<size_t>(r) * kSlotBytes; }
  char* result() { return slot(size_); }

 private:
  explicit ShmSegment(int64_t size);
  // Maps `name`, creating it first when `create`: "" on success, else why not.
  std::string map(const std::string& name, bool create);

  int64_t size_;
  size_t control_;  // bytes before the first slot
  size_t bytes_;
  void* base_;
};

}  // namespace lockstep::dist
