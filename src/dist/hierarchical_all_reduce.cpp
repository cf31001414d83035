// Note [Hierarchical all-reduce]
// Ranks on several hosts (see Note [Hosts]) that all-reduce in one flat Gloo ring send every
// gradient byte across the hosts' links as often as the ring crosses them: with N ranks numbered
// host by host, the rank at each host's edge sends 2(N-1)/N x B of a B-byte buffer over its host's
// link, and every one of the 2(N-1) steps pays the link's latency. Horovod, NCCL's trees and the 2D
// all-reduces reduce inside the host first. Here, on every rank, in place:
//   1. all-reduce inside the host (shared memory: Note [Collectives through shared memory]); every
//      rank of the host then holds the host's sum, the same bits on each;
//   2. all-reduce of shard i (elements [i*c, (i+1)*c), c = ceil(B/L), the last one shorter or empty)
//      across hosts among the ranks with local index i, one per host, over Gloo: L rings of H ranks
//      side by side, each with 1/L of the buffer;
//   3. inside the host, rank i broadcasts its shard (shared memory): every rank holds the whole sum.
// The buffer goes through these steps in pieces of kPieceBytes, overlapped: the host sums every
// piece at once (the shared-memory worker runs them in order), each piece's shard crosses the hosts
// as soon as its sum is there (Gloo runs several at once), and each piece is gathered as soon as its
// shards are back, while the next ones cross. Only the first piece's sum and the last one's gather
// are not hidden behind the link: measured over a 1 Gbit/s link, 64 MiB took 633 ms in three
// sequential steps against 537 ms for the link alone.
// Each host link then carries 2(H-1)/H x B, the lower bound for H hosts, against the flat ring's
// 2(N-1)/N x B: 1.5x less for 2 hosts x 2 ranks, 1.875x for 2 x 8, approaching 1x for many hosts,
// where what remains is the latency of 2(H-1) ring steps instead of 2(N-1). Step 1 moves the whole
// buffer through memory where a reduce-scatter would move only 1/L of it out again: cheap beside a
// 1-10 Gbit/s link, worth a shared-memory reduce-scatter on faster ones.
//
// Results: the same bits on every rank (each step ends with every participant holding one
// value: the host sums are identical within a host, Gloo's ring ends with an all-gather, step 3
// copies). Against flat, the sum is associated differently ((a0 + a1) + (b0 + b1) instead of the
// ring's order): two orders of summing N floats differ by at most 2(N-1) u sum_k |x_k| per element
// (u = 2^-24 for fp32), the bound the tests check. Mean divides afterwards, as flat does.
//
// Only sums and means of contiguous CPU fp32, fp64 and fp16 go this way: bf16 has no Gloo
// reduction (DDP's bf16 compression all-gathers instead) and max/min are rare and small. They,
// and everything else, use the flat Gloo group. The three steps run on one worker thread per
// group, in issue order, so all_reduce_async returns at once and DDP overlaps its buckets with
// backward as it does on one host. Its subgroups are the parent's (Note [Subgroups]); the parent's
// bytes_sent() keeps the ring model (Note [Counting bytes on the wire]).
#include "hierarchical_all_reduce.h"

#include <c10/util/StringUtil.h>
#include <pthread.h>

#include <algorithm>
#include <vector>

namespace lockstep::dist {

HierarchicalAllReduce::HierarchicalAllReduce(std::unique_ptr<ProcessGroup> local, std::unique_ptr<ProcessGroup> cross,
                                             std::chrono::milliseconds timeout)
    : local_(std::move(local)), cross_(std::move(cross)), timeout_(timeout) {
  worker_ = std::thread([this] { work_loop(); });
}

HierarchicalAllReduce::~HierarchicalAllReduce() {
  jobs_.stop();
  worker_.join();
}

bool HierarchicalAllReduce::accepts(const torch::Tensor& tensor, ReduceOp op) {
  const auto dtype = tensor.scalar_type();
  return (op == ReduceOp::kSum || op == ReduceOp::kMean) && tensor.device().is_cpu() &&
         tensor.layout() == torch::kStrided && tensor.is_contiguous() &&
         (dtype == torch::kFloat || dtype == torch::kDouble || dtype == torch::kHalf);
}

std::string HierarchicalAllReduce::describe() const {
  return c10::str("hierarchical (", cross_->size(), " hosts x ", local_->size(), " ranks; inside a host ",
                  local_->uses_shared_memory() ? "through shared memory" : "over Gloo", ", across hosts over Gloo)");
}

c10::intrusive_ptr<c10d::Work> HierarchicalAllReduce::all_reduce(const torch::Tensor& tensor) {
  // Each of its three steps waits at most the timeout for a piece (queued ones wait for those before).
  const auto deadline = std::chrono::steady_clock::now() + timeout_ * (2 + local_->size());
  Job job{tensor, c10::make_intrusive<QueuedWork>(static_cast<int>(local_->rank()), c10d::OpType::ALLREDUCE, deadline)};
  c10::intrusive_ptr<c10d::Work> work = job.work;
  jobs_.push(std::move(job));
  return work;
}

void HierarchicalAllReduce::work_loop() {
  pthread_setname_np(pthread_self(), "lockstep-hier");
  for (Job job; jobs_.pop(job);) {
    std::exception_ptr error;
    try {
      run(job.tensor);
    } catch (const std::exception&) {
      error = std::current_exception();
    }
    c10::intrusive_ptr<QueuedWork> work = std::move(job.work);
    job = Job();  // see QueuedWork: no tensor outlives the collective on this thread
    work->complete(error);
  }
}

void HierarchicalAllReduce::run(const torch::Tensor& tensor) {
  torch::NoGradGuard no_grad;
  torch::Tensor flat = tensor.view({-1});
  const int64_t ranks = local_->size(), per_piece = kPieceBytes / static_cast<int64_t>(flat.element_size());
  std::vector<torch::Tensor> pieces;
  for (int64_t begin = 0; begin < flat.numel(); begin += per_piece)
    pieces.push_back(flat.narrow(0, begin, std::min(per_piece, flat.numel() - begin)));
  const auto shard = [&](const torch::Tensor& piece, int64_t i) {
    const int64_t n = piece.numel(), chunk = (n + ranks - 1) / ranks, begin = std::min(n, i * chunk);
    return piece.narrow(0, begin, std::min(chunk, n - begin));
  };
  // See Note [Hierarchical all-reduce]: the steps overlap piece by piece.
  std::vector<c10::intrusive_ptr<c10d::Work>> summed, crossed, gathered;
  for (torch::Tensor& piece : pieces) summed.push_back(local_->all_reduce_async(piece));
  std::vector<torch::Tensor> mine;
  for (size_t p = 0; p < pieces.size(); ++p) {
    local_->wait(summed[p], "hierarchical all-reduce: the host's sum");
    mine.push_back(shard(pieces[p], local_->rank()));
    // Empty shards are empty on every rank of cross_ (the same numel and position on each).
    crossed.push_back(mine.back().numel() > 0 ? cross_->all_reduce_async(mine.back())
                                              : c10::intrusive_ptr<c10d::Work>());
  }
  std::vector<torch::Tensor> parts;
  for (size_t p = 0; p < pieces.size(); ++p) {
    if (crossed[p]) cross_->wait(crossed[p], "hierarchical all-reduce: the sum across hosts");
    for (int64_t i = 0; i < ranks; ++i) {
      parts.push_back(shard(pieces[p], i));
      if (parts.back().numel() > 0) gathered.push_back(local_->broadcast_async(parts.back(), i));
    }
  }
  for (const auto& work : gathered) local_->wait(work, "hierarchical all-reduce: gathering the host's shards");
}

}  // namespace lockstep::dist
