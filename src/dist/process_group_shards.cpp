// ProcessGroup's collectives over shards (ZeRO's and FSDP's): reduce_scatter and all_gather_into,
// through shared memory between the ranks of one host (Note [Collectives through shared memory]),
// else over the backend: Gloo has no reduce-scatter and no flat all-gather (Note [Reduce-scatter
// and flat all-gather on Gloo] in process_group.h).
#include <c10/util/StringUtil.h>

#include <algorithm>

#include "lockstep/dist/process_group.h"
#include "shm_collectives.h"
#include "wire_words.h"

namespace lockstep::dist {
namespace {

// A work that has finished: what a collective done on the calling thread returns.
c10::intrusive_ptr<c10d::Work> completed_work(int64_t rank, c10d::OpType type) {
  auto done = c10::make_intrusive<QueuedWork>(static_cast<int>(rank), type, std::chrono::steady_clock::now());
  done->complete(nullptr);
  return done;
}

}  // namespace

void ProcessGroup::reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  const int64_t n = output.numel();
  TORCH_CHECK_VALUE(n > 0 && input.numel() == n * size_, "reduce_scatter on rank ", rank_, " of ", size_,
                    ": input has ", input.numel(), " elements and output ", n, "; the input must hold ", size_,
                    " equal, non-empty chunks (", size_, " x output elements): pad it to a multiple of ", size_);
  reduce_scatter(output, input, std::vector<int64_t>(size_, n), op);
}

void ProcessGroup::reduce_scatter(torch::Tensor& output, const torch::Tensor& input, const std::vector<int64_t>& counts,
                                  ReduceOp op) {
  wait(start_reduce_scatter(output, input, counts, op, /*waits_next=*/true), "reduce_scatter");
  if (op == ReduceOp::kMean && shm_ && ShmCollectives::accepts_reduce_scatter(output, input, op)) output.div_(size_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::reduce_scatter_async(torch::Tensor& output, const torch::Tensor& input,
                                                                  const std::vector<int64_t>& counts) {
  return start_reduce_scatter(output, input, counts, ReduceOp::kSum, /*waits_next=*/false);
}

// Over the backend the reduction follows the alltoall on this thread, so the work returned has
// completed; through shared memory it is the worker's (or this thread's: Note [Collectives on the
// calling thread]).
c10::intrusive_ptr<c10d::Work> ProcessGroup::start_reduce_scatter(torch::Tensor& output, const torch::Tensor& input,
                                                                  const std::vector<int64_t>& counts, ReduceOp op,
                                                                  bool waits_next) {
  TORCH_CHECK_VALUE(input.scalar_type() == output.scalar_type(), "reduce_scatter on rank ", rank_, " of ", size_,
                    ": input is ", input.scalar_type(), " but output is ", output.scalar_type(),
                    "; give both one dtype");
  TORCH_CHECK_VALUE(static_cast<int64_t>(counts.size()) == size_, "reduce_scatter on rank ", rank_, " of ", size_,
                    ": ", counts.size(), " counts given; give one per rank");
  int64_t total = 0;
  for (int64_t c : counts) {
    TORCH_CHECK_VALUE(c >= 0, "reduce_scatter on rank ", rank_, ": count ", c, " is negative");
    total += c;
  }
  const int64_t n = counts[rank_];
  TORCH_CHECK_VALUE(input.numel() == total && output.numel() == n, "reduce_scatter on rank ", rank_, " of ", size_,
                    ": input has ", input.numel(), " elements and output ", output.numel(), ", but the counts sum to ",
                    total, " and this rank's is ", n);
  TORCH_CHECK_VALUE(output.is_contiguous(), "reduce_scatter on rank ", rank_, ": output must be contiguous");
  const bool narrow_float = input.scalar_type() == torch::kBFloat16 || input.scalar_type() == torch::kHalf;
  const bool even = std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
  torch::NoGradGuard no_grad;
  count_sent(static_cast<double>((total - n) * static_cast<int64_t>(input.element_size())));
  // See Note [Collectives through shared memory].
  if (shm_ && ShmCollectives::accepts_reduce_scatter(output, input, op))
    return shm_->reduce_scatter(output, input, counts,
                                waits_next ? ShmCollectives::When::kNowIfIdle : ShmCollectives::When::kQueue);
  torch::Tensor received;  // (N, n): row r is rank r's chunk for this rank
  if (size_ == 1) {
    received = input.reshape({1, n});
  } else {
    received = torch::empty({size_, n}, input.options());
    torch::Tensor send = as_wire_words(input.contiguous().reshape({-1}));
    torch::Tensor recv = as_wire_words(received.view({-1}));  // splits count along dim 0
    std::vector<int64_t> out_splits, in_splits;  // both empty: N equal chunks
    if (!even) {
      out_splits.assign(size_, n);
      in_splits = counts;
    }
    wait(backend_->alltoall_base(recv, send, out_splits, in_splits), "reduce_scatter");
  }
  if (n == 0) return completed_work(rank_, c10d::OpType::REDUCE_SCATTER);
  const torch::Tensor rows = narrow_float ? received.to(torch::kFloat) : received;
  torch::Tensor reduced;
  switch (op) {
    case ReduceOp::kMax: reduced = rows.amax(0); break;
    case ReduceOp::kMin: reduced = rows.amin(0); break;
    case ReduceOp::kMean: reduced = rows.sum(0).div_(size_); break;
    default: reduced = rows.sum(0);
  }
  output.view({-1}).copy_(reduced);
  return completed_work(rank_, c10d::OpType::REDUCE_SCATTER);
}

void ProcessGroup::all_gather_into(torch::Tensor& output, const torch::Tensor& input) {
  wait(start_all_gather_into(output, input, /*waits_next=*/true), "all_gather_into");
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::all_gather_into_async(torch::Tensor& output, const torch::Tensor& input) {
  return start_all_gather_into(output, input, /*waits_next=*/false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::start_all_gather_into(torch::Tensor& output, const torch::Tensor& input,
                                                                   bool waits_next) {
  const int64_t n = input.numel();
  TORCH_CHECK_VALUE(input.scalar_type() == output.scalar_type(), "all_gather_into on rank ", rank_, " of ", size_,
                    ": input is ", input.scalar_type(), " but output is ", output.scalar_type(), "; give both one dtype");
  TORCH_CHECK_VALUE(n > 0 && output.numel() == n * size_, "all_gather_into on rank ", rank_, " of ", size_, ": input has ",
                    n, " elements and output ", output.numel(), "; the output must hold ", size_,
                    " x input elements, and the input at least one");
  TORCH_CHECK_VALUE(output.is_contiguous(), "all_gather_into on rank ", rank_, ": output must be contiguous");
  torch::NoGradGuard no_grad;
  torch::Tensor flat = output.view({-1});
  if (size_ == 1) {
    flat.copy_(input.reshape({-1}));
    return completed_work(rank_, c10d::OpType::ALLGATHER);
  }
  count_sent(ring_share() * static_cast<double>(output.nbytes()));
  // See Note [Collectives through shared memory] and Note [Collectives on the calling thread].
  if (shm_ && ShmCollectives::accepts_all_gather(output, input))
    return shm_->all_gather(output, input, waits_next ? ShmCollectives::When::kNowIfIdle : ShmCollectives::When::kQueue);
  std::vector<torch::Tensor> in{as_wire_words(input.contiguous().reshape({-1}))};
  std::vector<std::vector<torch::Tensor>> outs(1);  // views of `output`: Gloo copies each rank's chunk there
  for (int64_t r = 0; r < size_; ++r) outs[0].push_back(as_wire_words(flat.narrow(0, r * n, n)));
  return backend_->allgather(outs, in);
}

}  // namespace lockstep::dist
