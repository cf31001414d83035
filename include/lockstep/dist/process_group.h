#pragma once

#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace lockstep::dist {

enum class ReduceOp { kSum, kMean, kMax, kMin };

// Whether sum and mean all-reduces and broadcasts of ranks that share a host go through shared
// memory instead of Gloo (see Note [Collectives through shared memory] in
// src/dist/shm_collectives.cpp). kAuto: when every rank of the group is on this host and none set
// LOCKSTEP_SHM=0.
enum class SharedMemory { kAuto, kOff };
// Whether this process lets ranks of one host use shared memory: `mode` kAuto and LOCKSTEP_SHM not
// "0" (any rank that says no turns it off for its group).
bool wants_shared_memory(SharedMemory mode = SharedMemory::kAuto);

// How sum and mean all-reduces of ranks on several hosts travel (see Note [Hierarchical
// all-reduce] in src/dist/hierarchical_all_reduce.cpp). kFlat: one Gloo ring over every rank.
// kHierarchical: reduce inside each host through shared memory, all-reduce one shard per local
// rank across hosts over Gloo, gather inside the host (Horovod's and NCCL's tree of rings). kAuto:
// hierarchical when the ranks span several hosts with the same number of ranks, at least two, on
// each; flat otherwise.
enum class AllReduceAlgorithm { kAuto, kFlat, kHierarchical };
const std::vector<std::string>& all_reduce_algorithm_names();  // "auto", "flat", "hierarchical"

class HierarchicalAllReduce;
class ShmCollectives;

struct InitOptions {
  // env:// (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, or mpirun/srun variables; see core/world.h),
  // tcp://HOST:PORT, or file://PATH (a file on a filesystem every rank sees).
  TORCH_ARG(std::string, init_method) = "env://";
  TORCH_ARG(int64_t, rank) = -1;        // -1: from the environment
  TORCH_ARG(int64_t, world_size) = -1;  // -1: from the environment
  TORCH_ARG(std::string, backend) = "auto";  // auto (nccl for CUDA LibTorch with NCCL, else gloo) | gloo | nccl
  // Applies to the rendezvous and to every collective; nothing waits longer.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(5);
  // The rendezvous's own, when set (torchrun's rdzv timeout beside the collectives'): ranks that
  // start at different times get longer to meet than a collective gets to finish.
  TORCH_ARG(c10::optional<std::chrono::milliseconds>, rendezvous_timeout) = c10::nullopt;
  TORCH_ARG(SharedMemory, shared_memory) = SharedMemory::kAuto;
  // The network interfaces Gloo binds, comma-separated ("eth1" or "eth1,eth2": Gloo spreads its
  // connections over several), as GLOO_SOCKET_IFNAME is for PyTorch. Empty: the environment's
  // LOCKSTEP_SOCKET_IFNAME, else GLOO_SOCKET_IFNAME, else the address this host's name resolves to
  // (Gloo's default). A name this host does not have is refused before the rendezvous.
  TORCH_ARG(std::string, iface) = "";
  // kAuto: LOCKSTEP_ALLREDUCE when set (auto, flat or hierarchical), else the topology decides.
  // kHierarchical where the hosts hold different numbers of ranks is refused, naming them.
  TORCH_ARG(AllReduceAlgorithm, allreduce) = AllReduceAlgorithm::kAuto;
};

// One process's membership in a group of ranks: the store, the c10d backend, and the collectives
// users need. Owned (RAII): destroying it tears the group down. No globals.
class ProcessGroup {
 public:
  // Collective over the group: with kAuto, every rank maps the shared-memory segment here.
  // `interfaces`: what the backend's Gloo devices bound (empty: Gloo's default), for its subgroups'
  // own; `network`: how the ranks reach each other, for describe() ("store 10.0.0.1:29500; ...").
  ProcessGroup(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> backend,
               std::chrono::milliseconds timeout, SharedMemory shared_memory = SharedMemory::kOff,
               std::vector<std::string> interfaces = {}, std::string network = "");
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int64_t rank() const { return rank_; }
  int64_t size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // The group's effective settings in one line, what a run prints first on rank 0: the world,
  // the store, the interfaces and addresses Gloo bound, shared memory, the timeout.
  std::string describe() const;

  // Whether sum and mean all-reduces of contiguous CPU floats and broadcasts of contiguous CPU
  // tensors go through shared memory (see Note [Collectives through shared memory]); the same on
  // every rank. Nothing else changes with it.
  bool uses_shared_memory() const { return shm_ != nullptr; }

  // Note [Hosts]: ranks share a host when they share memory and a network stack: the same
  // hostname and boot, and the same IPC, PID and network namespaces (a container or a network
  // namespace is a host of its own). Entry r is rank r's host, hosts numbered in the order of their
  // lowest rank; the same on every rank.
  const std::vector<int64_t>& host_of_rank() const { return host_of_rank_; }
  int64_t hosts() const;
  // kFlat or kHierarchical: what sum and mean all-reduces of contiguous CPU fp32, fp64 and fp16
  // use (bf16, max and min always go flat).
  AllReduceAlgorithm all_reduce_algorithm() const {
    return hierarchical_ ? AllReduceAlgorithm::kHierarchical : AllReduceAlgorithm::kFlat;
  }

  // In place, on every rank. kMean divides the sum by size().
  void all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // Starts a sum all-reduce and returns at once; wait() on the result. For overlap (DDP). Like
  // every collective, every rank issues the same ones in the same order.
  c10::intrusive_ptr<c10d::Work> all_reduce_async(torch::Tensor& tensor);
  // Starts an all-gather of `tensor` into `out` (size() tensors shaped like it); wait() on the result.
  c10::intrusive_ptr<c10d::Work> all_gather_async(const torch::Tensor& tensor, std::vector<torch::Tensor>& out);
  void broadcast(torch::Tensor& tensor, int64_t root = 0);
  // Starts the broadcast and returns at once; wait() on the result (keep `tensor` alive until then).
  c10::intrusive_ptr<c10d::Work> broadcast_async(torch::Tensor& tensor, int64_t root = 0);
  // size() tensors, entry r holding rank r's `tensor` (same shape and dtype on every rank).
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor);
  // Note [Reduce-scatter and flat all-gather on Gloo]: Gloo has neither reduce_scatter nor
  // _allgather_base. reduce_scatter is an alltoall_base (rank r receives chunk r of every rank's
  // input: (N-1)/N of the input leaves each rank, as in a ring reduce-scatter) followed by a local
  // reduction over the N received chunks, ranks in order. 16-bit floats travel as their own
  // words (bf16 typed as Half: Gloo cannot add bf16, but alltoall only copies) and are reduced in
  // fp32, rounded once, which is closer to the exact sum than a ring that rounds N-1 times.
  // all_gather_into is the list all-gather with every rank's slot a view into one flat output.
  // A failure of either names the rank that did not arrive (see Note [Naming the rank that did not
  // arrive]); NCCL would call its own reduce_scatter and _allgather_base here instead. Between the
  // ranks of one host both go through shared memory (Note [Collectives through shared memory]):
  // the same results (16-bit sums in fp32, rounded once), without Gloo's threads and loopback.
  //
  // input: N x n elements (N = size()), contiguous; output: n elements, same dtype. Rank r gets
  // the reduction over ranks of input's elements [r*n, (r+1)*n): PyTorch's reduce_scatter_tensor.
  // Uneven (input not N x output) or empty inputs are rejected before anything travels.
  void reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op = ReduceOp::kSum);
  // MPI's Reduce_scatter with counts: input is size() consecutive chunks of counts[0], ...,
  // counts[N-1] elements (counts equal on every rank, some may be 0); rank r gets the reduction
  // over ranks of chunk r in output (counts[r] elements). ZeRO-2 reduces a bucket of a flat
  // gradient whose shards split it unevenly this way (see Note [Flat parameters and shards]).
  void reduce_scatter(torch::Tensor& output, const torch::Tensor& input, const std::vector<int64_t>& counts,
                      ReduceOp op = ReduceOp::kSum);
  // Starts the sum reduce_scatter with counts and returns; wait() on the result before reading
  // `output`, and keep both tensors alive and `input` unchanged until then. Between the ranks of
  // one host the group's worker runs it while the caller goes on (ZeRO-2 and FSDP overlap it with
  // backward, as DDP does its all-reduces: Note [Reducing gradients into shards]); over the
  // backend it has completed when it returns.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_async(torch::Tensor& output, const torch::Tensor& input,
                                                      const std::vector<int64_t>& counts);
  // input: n elements; output: N x n elements, contiguous, same dtype; elements [r*n, (r+1)*n) of
  // output receive rank r's input: PyTorch's all_gather_into_tensor.
  void all_gather_into(torch::Tensor& output, const torch::Tensor& input);
  // Starts all_gather_into and returns at once; wait() on the result before reading `output`, and
  // keep both tensors alive and `input` unchanged until then. FSDP gathers the next unit's
  // parameters this way while the current unit computes (Note [FSDP prefetch]).
  c10::intrusive_ptr<c10d::Work> all_gather_into_async(torch::Tensor& output, const torch::Tensor& input);
  // Returns when every rank has arrived; on timeout the error names the ranks that did not.
  void barrier();
  // Point-to-point, paired by (peer, tag) in the order posted: send_async starts sending
  // `tensor` (contiguous; keep it unchanged until the work is waited on) to rank `peer`; recv
  // fills `tensor` (contiguous, the sender's shape and dtype) from `peer` within the group's
  // timeout. Errors name this rank, the peer and `what` ("activations of micro-batch 3").
  c10::intrusive_ptr<c10d::Work> send_async(const torch::Tensor& tensor, int64_t peer, int64_t tag);
  void recv(torch::Tensor& tensor, int64_t peer, int64_t tag, const std::string& what);
  // The mean of a scalar over all ranks (the reduce_tensor helper of PyTorch DDP scripts).
  double average(double value);

  // Note [Subgroups]
  // PyTorch's dist.new_group(ranks): a group of some of this group's ranks, numbered by their
  // position in `ranks` (ascending, no repeats), with its own Gloo context over this group's store
  // under a prefix of its own, and the same timeout. Like new_group, it is collective over this
  // group: every rank calls it for every subgroup, in the same order (the prefix counts the calls),
  // even for subgroups it is not in; those ranks get nullptr. Its collectives and their errors
  // name its own ranks and then the parent's ("rank 1 of 2 (ranks 1, 3 of the parent)"); the bytes
  // it sends count in the parent's bytes_sent() too. It must not outlive this group. `allreduce`:
  // its own all-reduce algorithm, chosen from its ranks' hosts as InitOptions::allreduce is.
  std::unique_ptr<ProcessGroup> new_group(const std::vector<int64_t>& ranks,
                                          AllReduceAlgorithm allreduce = AllReduceAlgorithm::kFlat);

  // Waits for `work` within the group's timeout; failures name this rank, `what`, and the ranks
  // that stalled or died (see Note [Naming the rank that did not arrive]).
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what);

  c10d::Backend& backend() { return *backend_; }

  // Note [Counting bytes on the wire]
  // Payload bytes this rank has sent in collectives since the group was made, by the cost model
  // of a bandwidth-optimal (ring) algorithm for a buffer of B bytes on N ranks, whatever Gloo
  // picks: all-reduce 2(N-1)/N x B (a reduce-scatter then an all-gather); reduce-scatter of a B-byte
  // input (N-1)/N x B (everything but this rank's own chunk leaves it; with counts, the input less
  // its own chunk); all-gather into a B-byte output (N-1)/N x B; broadcast (N-1)/N x B (scatter
  // then all-gather); alltoall the bytes that leave for other ranks; barriers 0. One rank: 0. The
  // ZeRO paper's 2Psi per step for DDP and ZeRO-1/2 is in these units (elements x their size).
  int64_t bytes_sent() const { return bytes_sent_.load(); }

 private:
  void count_sent(double bytes) {
    bytes_sent_ += static_cast<int64_t>(bytes);
    if (parent_ != nullptr && counts_in_parent_) parent_->count_sent(bytes);
  }
  // Collective: builds the local and cross-host subgroups when `algorithm` (or kAuto's choice)
  // is hierarchical. See Note [Hierarchical all-reduce].
  void choose_all_reduce(AllReduceAlgorithm algorithm);
  // waits_next: the caller waits for the work at once (the synchronous collectives), so on shared
  // memory it may run on this thread (Note [Collectives on the calling thread]).
  c10::intrusive_ptr<c10d::Work> start_all_reduce(torch::Tensor& tensor, ReduceOp op, bool waits_next);
  c10::intrusive_ptr<c10d::Work> start_broadcast(torch::Tensor& tensor, int64_t root, bool waits_next);
  c10::intrusive_ptr<c10d::Work> start_all_gather_into(torch::Tensor& output, const torch::Tensor& input,
                                                       bool waits_next);
  c10::intrusive_ptr<c10d::Work> start_reduce_scatter(torch::Tensor& output, const torch::Tensor& input,
                                                      const std::vector<int64_t>& counts, ReduceOp op, bool waits_next);
  friend std::unique_ptr<ProcessGroup> init_process_group(const InitOptions& options);
  double ring_share() const { return static_cast<double>(size_ - 1) / static_cast<double>(size_); }

  // Which ranks are still alive after a failed collective, as a sentence for its error.
  std::string roll_call();

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  std::chrono::milliseconds timeout_;
  int64_t rank_;
  int64_t size_;
  std::atomic<int64_t> bytes_sent_{0};
  ProcessGroup* parent_ = nullptr;  // a subgroup's (see Note [Subgroups])
  bool counts_in_parent_ = true;    // false for a hierarchical all-reduce's own subgroups: the parent counts the ring
  std::string parent_ranks_;        // a subgroup's, for errors: " (ranks 1, 3 of the parent)"
  int64_t subgroups_made_ = 0;
  SharedMemory shared_memory_;
  std::vector<std::string> interfaces_;  // Gloo's, by name; empty: its default device
  std::string network_;                  // for describe()
  std::vector<int64_t> host_of_rank_;
  std::unique_ptr<ShmCollectives> shm_;  // after the rest: its worker stops before the rest goes
  std::unique_ptr<HierarchicalAllReduce> hierarchical_;  // last: its worker uses its subgroups and stops first
};

// Joins (or, on rank 0 with tcp:// and env://, hosts) the rendezvous and builds the backend.
// Errors name this rank and say what to fix: rank >= world size, a port in use, a master that
// never answered (its address and port), and how many ranks had arrived when the timeout hit.
std::unique_ptr<ProcessGroup> init_process_group(const InitOptions& options = {});

}  // namespace lockstep::dist
