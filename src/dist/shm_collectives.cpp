// Note [Collectives through shared memory]
// Ranks on one host that all-reduce over Gloo send every byte through the kernel's TCP loopback:
// copied into a socket buffer, out of it, and through Gloo's own buffers, at ~1 GB/s here. For
// mlp-wide (29.7 MB of fp32 gradients a step) that was ~30 ms of a 64 ms two-rank step. When every
// rank of a group runs on this host (same hostname and boot_id, same IPC and PID namespaces: each
// rank writes its identity into the group's store when the group is made), a contiguous CPU fp32,
// fp64, fp16 or bf16 sum or mean all-reduce goes through one shared-memory segment instead, as
// DeepSpeed's CPU backend and oneCCL do; so does a broadcast of any contiguous CPU tensor (DDP's
// buffers before every forward: over Gloo a round trip through its threads and the loopback for a
// few hundred bytes), and so do ZeRO's and FSDP's all_gather_into (any dtype) and reduce_scatter
// (sums; means of fp32/fp64), which over Gloo cost a list all-gather or an all-to-all through the
// loopback each, several per step (shm_gather_scatter.cpp: the same two steps per round of a
// slot). Everything else (max/min, other dtypes, the list all_gather, several hosts,
// InitOptions::shared_memory(kOff), LOCKSTEP_SHM=0 on any rank) goes to Gloo as before.
//
// Segment (shm_segment.cpp): rank 0 creates it (shm_open under a name unique to this group,
// published in the store), the others map it, and rank 0 unlinks the name once all have mapped it,
// before the group exists: a crash leaves nothing in /dev/shm. Layout: a control area (a 128-byte
// line for the group and one per rank, so ranks never write each other's cache lines), one 2 MiB
// slot per rank, and a result slot of that size. Larger tensors go in chunks of a slot.
//
// Per chunk, a reduce-scatter then an all-gather through memory, with two steps:
//   1. every rank copies its chunk into its slot, all but its own slice (below), and announces;
//      all wait for all;
//   2. rank r sums slice r (1/N of the chunk) over the other ranks' slots and its own tensor, ranks
//      in order (so every rank gets the same bits and two ranks get exactly Gloo's a + b; 16-bit
//      floats are summed in fp32 and rounded once), writes it into the result slot and announces;
//      all wait for all; then every rank copies the whole result out.
// Reading its own slice from its tensor spares each rank a copy of 1/N of the data (two ranks of
// mlp-wide: 14.8 of 29.7 MB a step copied in).
// No slot is overwritten while it is read: a rank refills its slot (step 1 of the next chunk) only
// after step 2's wait, so everyone has finished summing from it; it writes the result slot (step 2)
// only after step 1's wait of that chunk, which everyone reaches after copying the last result out.
// A broadcast has the same two steps: the root copies its chunk into its slot, everyone announces
// and waits for all; then the others copy it out, and everyone announces and waits again, so the
// root refills its slot (next chunk) only after all have copied from it. It touches no other slot.
//
// An announcement is a per-rank counter (a lock-free std::atomic<uint32_t>, which is what futex
// needs) raised by one. A waiter spins briefly (two cores are shared by all ranks: a long spin
// steals the core of the rank it waits for), then sleeps in FUTEX_WAIT on the shared word (not the
// _PRIVATE variant: the word is in another process's mapping too); a rank that announces calls
// FUTEX_WAKE only when someone registered as sleeping on its counter. Every wait ends by the
// collective's deadline (issue time + the group's timeout) and names the ranks that did not
// arrive, this rank, and the collective's number (see Note [Naming the rank that did not arrive]);
// it ends early when a rank's process has exited, or a rank gave up or destroyed its group (it
// marks the segment abandoned): Gloo notices a closed connection as fast.
//
// The collectives run in issue order on one worker thread per group, so all_reduce_async returns at
// once, as Gloo's does, and DDP overlaps its bucket all-reduces with backward. Every rank issues
// the same shared-memory collectives in the same order (as for any collective); Gloo collectives on
// the same group run beside them independently. Subgroups (Note [Subgroups]) get their own segment.
// bytes_sent() keeps counting the ring model (Note [Counting bytes on the wire]).
#include "shm_collectives.h"

#include <c10/util/StringUtil.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include "shm_sum.h"

namespace lockstep::dist {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kSpins = 128;  // a few microseconds of pause before sleeping
constexpr auto kPoll = std::chrono::milliseconds(100);  // how often a sleeper checks for exited ranks

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

void wake_all(std::atomic<uint32_t>& word) { futex(&word, FUTEX_WAKE, INT_MAX, nullptr); }

bool reached(uint32_t stage, uint32_t target) { return static_cast<int32_t>(stage - target) >= 0; }

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

std::unique_ptr<ShmCollectives> ShmCollectives::create(c10d::Store& store, int64_t rank, int64_t size,
                                                       std::chrono::milliseconds timeout) {
  auto segment = ShmSegment::open(store, rank, size);
  if (segment == nullptr) return nullptr;
  return std::unique_ptr<ShmCollectives>(new ShmCollectives(std::move(segment), rank, size, timeout));
}

ShmCollectives::ShmCollectives(std::unique_ptr<ShmSegment> segment, int64_t rank, int64_t size,
                               std::chrono::milliseconds timeout)
    : segment_(std::move(segment)), rank_(rank), size_(size), timeout_(timeout) {
  worker_ = std::thread([this] { work_loop(); });
}

ShmCollectives::~ShmCollectives() {
  jobs_.stop();
  aborting_ = true;  // a collective still waiting (its caller gave up on it) ends now
  abandon();
  worker_.join();
}

bool ShmCollectives::accepts(const torch::Tensor& tensor, ReduceOp op) {
  const auto dtype = tensor.scalar_type();
  return (op == ReduceOp::kSum || op == ReduceOp::kMean) && tensor.device().is_cpu() &&
         tensor.layout() == torch::kStrided && tensor.is_contiguous() &&
         (dtype == torch::kFloat || dtype == torch::kDouble || dtype == torch::kHalf || dtype == torch::kBFloat16);
}

bool ShmCollectives::accepts_broadcast(const torch::Tensor& tensor) {
  return tensor.device().is_cpu() && tensor.layout() == torch::kStrided && tensor.is_contiguous();
}

c10::intrusive_ptr<c10d::Work> ShmCollectives::all_reduce(const torch::Tensor& tensor, When when) {
  Job job;
  job.kind = Kind::kAllReduce;
  job.tensor = tensor;
  return enqueue(std::move(job), c10d::OpType::ALLREDUCE, when);
}

c10::intrusive_ptr<c10d::Work> ShmCollectives::broadcast(const torch::Tensor& tensor, int64_t root, When when) {
  Job job;
  job.kind = Kind::kBroadcast;
  job.tensor = tensor;
  job.root = root;
  return enqueue(std::move(job), c10d::OpType::BROADCAST, when);
}

// Note [Collectives on the calling thread]
// A collective the caller waits for at once (every synchronous one: ZeRO's and FSDP's gathers and
// reduce-scatters, SyncBatchNorm's statistics, a broadcast) gains nothing from the worker: handing it
// over costs two wake-ups, the worker's and then the caller's, tens of microseconds each on two
// shared cores, several times a step. So when the worker is idle and nothing is queued, the caller
// runs it itself, as the worker would; otherwise it queues behind the others, as collectives must
// run in issue order. JobQueue::try_claim keeps the two turns apart: the worker takes no job while
// a caller runs one, and a caller runs none while the worker is in one or any is queued. Only
// stage_ and failure_ are shared between the turns, and the queue's mutex orders them.
c10::intrusive_ptr<c10d::Work> ShmCollectives::enqueue(Job job, c10d::OpType type, When when) {
  job.deadline = Clock::now() + timeout_;
  job.work = c10::make_intrusive<QueuedWork>(static_cast<int>(rank_), type, job.deadline);
  c10::intrusive_ptr<c10d::Work> work = job.work;
  if (when == When::kNowIfIdle && jobs_.try_claim(job, &Job::seq)) {
    execute(std::move(job));
    jobs_.release();
    return work;
  }
  jobs_.push(std::move(job), &Job::seq);
  return work;
}

void ShmCollectives::work_loop() {
  pthread_setname_np(pthread_self(), "lockstep-shm");  // how top -H, perf and /proc tell it from compute
  for (Job job; jobs_.pop(job);) execute(std::move(job));
}

void ShmCollectives::execute(Job job) {
  std::exception_ptr error;
  try {
    TORCH_CHECK(failure_.empty(), "shared-memory ", job.name(), " #", job.seq, " on rank ", rank_, " of ", size_,
                " was not run: an earlier one failed (", failure_, ")");
    TORCH_CHECK(!aborting_, "shared-memory ", job.name(), " #", job.seq, " on rank ", rank_, " of ", size_,
                " was not run: the process group was destroyed first");
    run(job);
  } catch (const c10::Error& e) {
    if (failure_.empty()) failure_ = e.what_without_backtrace();
    abandon();
    error = std::current_exception();
  }
  c10::intrusive_ptr<QueuedWork> work = std::move(job.work);
  job = Job();  // see QueuedWork: no tensor outlives the collective on the worker
  work->complete(error);
}

void ShmCollectives::run(const Job& job) {
  if (job.kind == Kind::kAllGather) return run_all_gather(job);
  if (job.kind == Kind::kReduceScatter) return run_reduce_scatter(job);
  auto* data = static_cast<char*>(job.tensor.data_ptr());
  const int64_t element = static_cast<int64_t>(job.tensor.element_size());
  const int64_t numel = job.tensor.numel(), per_chunk = ShmSegment::kSlotBytes / element;
  const int64_t chunks = (numel + per_chunk - 1) / per_chunk;
  const bool broadcast = job.kind == Kind::kBroadcast;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t offset = c * per_chunk, n = std::min(per_chunk, numel - offset);
    char* chunk = data + offset * element;
    const auto bytes = static_cast<size_t>(n * element);
    // Rank r's slice of an all-reduce: n / N elements, the first n % N ranks one more. It sums its
    // own slice from its own tensor, so that part never goes through its slot.
    const int64_t base = n / size_, extra = n % size_;
    const int64_t begin = rank_ * base + std::min(rank_, extra), count = base + (rank_ < extra ? 1 : 0);
    if (broadcast) {
      if (job.root == rank_) std::memcpy(segment_->slot(rank_), chunk, bytes);
    } else {
      const int64_t end = begin + count;
      char* slot = segment_->slot(rank_);
      std::memcpy(slot, chunk, static_cast<size_t>(begin * element));
      std::memcpy(slot + end * element, chunk + end * element, static_cast<size_t>((n - end) * element));
    }
    if (c == 0) describe(job);
    announce();
    await_all(job, c, chunks, broadcast ? "its part of the broadcast" : "its input");
    if (c == 0) check_shapes(job);
    if (broadcast) {
      if (job.root != rank_) std::memcpy(chunk, segment_->slot(job.root), bytes);
      announce();  // the root refills its slot only after everyone has copied from it
      await_all(job, c, chunks, "its copy of the root's chunk");
      continue;
    }
    sum_slice(job, chunk, begin, count);
    announce();
    await_all(job, c, chunks, "its slice of the sum");
    std::memcpy(chunk, segment_->result(), bytes);
  }
}

void ShmCollectives::sum_slice(const Job& job, const char* chunk, int64_t begin, int64_t count) {
  const int64_t element = static_cast<int64_t>(job.tensor.element_size());
  std::vector<const void*> in;
  for (int64_t r = 0; r < size_; ++r) in.push_back((r == rank_ ? chunk : segment_->slot(r)) + begin * element);
  shm::sum_slices(job.tensor.scalar_type(), segment_->result() + begin * element, in, count);
}

void ShmCollectives::announce() {
  ShmRankLine& mine = segment_->line(rank_);
  mine.stage.store(++stage_, std::memory_order_seq_cst);
  // seq_cst on both sides: either a sleeper's futex sees the new value, or this sees the sleeper.
  if (mine.waiters.load(std::memory_order_seq_cst) > 0) wake_all(mine.stage);
}

void ShmCollectives::await_all(const Job& job, int64_t chunk, int64_t chunks, const char* step) {
  const auto missing = [&] {
    std::vector<int64_t> ranks;
    for (int64_t r = 0; r < size_; ++r)
      if (!reached(segment_->line(r).stage.load(std::memory_order_acquire), stage_)) ranks.push_back(r);
    return ranks;
  };
  const auto fail = [&](const std::string& why) {  // returns if every rank arrived after all
    const std::vector<int64_t> late = missing();
    if (late.empty()) return;
    std::string last_seen;
    for (int64_t r : late)
      last_seen += c10::str(last_seen.empty() ? "" : ", ", "rank ", r, " was last in #",
                            segment_->line(r).seq.load(std::memory_order_relaxed));
    TORCH_CHECK(false, "shared-memory ", job.name(), " #", job.seq, " (", job.tensor.numel(), " ",
                job.tensor.scalar_type(), " elements, chunk ", chunk + 1, " of ", chunks, ") on rank ", rank_,
                " of ", size_, ": ", late.size() == 1 ? "rank " : "ranks ", c10::Join(", ", late),
                " did not arrive with ", step, " ", why, " (", last_seen, ")");
  };
  for (int64_t q = 0; q < size_; ++q) {
    ShmRankLine& line = segment_->line(q);
    if (q == rank_ || reached(line.stage.load(std::memory_order_acquire), stage_)) continue;
    for (int i = 0; i < kSpins && !reached(line.stage.load(std::memory_order_acquire), stage_); ++i) cpu_relax();
    line.waiters.fetch_add(1, std::memory_order_seq_cst);
    struct Leave {
      std::atomic<uint32_t>& waiters;
      ~Leave() { waiters.fetch_sub(1, std::memory_order_seq_cst); }
    } leave{line.waiters};
    for (;;) {
      const uint32_t seen = line.stage.load(std::memory_order_seq_cst);
      if (reached(seen, stage_)) break;
      const uint32_t gone = segment_->group().abandoned.load(std::memory_order_acquire);
      if (gone != 0 && !reached(line.stage.load(std::memory_order_seq_cst), stage_)) {
        if (static_cast<int64_t>(gone) - 1 == rank_) fail("before this rank's process group was destroyed");
        fail(c10::str("before rank ", gone - 1, " gave up on the group's shared memory (its collective failed or "
                      "its process group was destroyed)"));
      }
      if (aborting_) fail("before this rank's process group was destroyed");
      if (::kill(line.pid, 0) != 0 && errno == ESRCH) fail(c10::str("(rank ", q, "'s process ", line.pid, " exited)"));
      const auto now = Clock::now();
      if (now >= job.deadline)
        fail(c10::str("within the timeout of ", std::chrono::duration<double>(timeout_).count(),
                      " s: it stalled or exited; if it is only slow, raise the timeout (lockstep train --timeout)"));
      const auto nap = std::min<Clock::duration>(job.deadline - now, kPoll);
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(nap).count();
      const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      futex(&line.stage, FUTEX_WAIT, seen, &ts);  // returns at once if `stage` moved on
    }
  }
}

void ShmCollectives::describe(const Job& job) {
  ShmRankLine& mine = segment_->line(rank_);
  mine.numel = job.tensor.numel();
  mine.dtype = static_cast<int32_t>(job.tensor.scalar_type());
  mine.kind = static_cast<int32_t>(job.kind);
  mine.root = job.root;
  mine.seq.store(job.seq, std::memory_order_relaxed);
}

void ShmCollectives::check_shapes(const Job& job) {
  const auto what = [](const ShmRankLine& line) {
    const char* name = name_of(static_cast<Kind>(line.kind));
    return c10::str(name[0] == 'a' ? "an " : "a ", name,
                    line.kind == static_cast<int32_t>(Kind::kBroadcast) ? c10::str(" from rank ", line.root) : "",
                    " of ", line.numel, " ", static_cast<c10::ScalarType>(line.dtype), " elements");
  };
  const ShmRankLine& mine = segment_->line(rank_);
  for (int64_t r = 0; r < size_; ++r) {
    const ShmRankLine& other = segment_->line(r);
    TORCH_CHECK(other.numel == mine.numel && other.dtype == mine.dtype && other.kind == mine.kind &&
                    other.root == mine.root,
                "shared-memory ", job.name(), " #", job.seq, " on rank ", rank_, " of ", size_, ": this rank is in ",
                what(mine), " but rank ", r, " is in ", what(other),
                "; every rank must issue the same collectives, of tensors of the same size and dtype, in the same "
                "order");
  }
}

void ShmCollectives::abandon() {
  uint32_t healthy = 0;
  segment_->group().abandoned.compare_exchange_strong(healthy, static_cast<uint32_t>(rank_ + 1));
  for (int64_t r = 0; r < size_; ++r) wake_all(segment_->line(r).stage);
}

}  // namespace lockstep::dist
