// The shared-memory all-gather and reduce-scatter: ZeRO's and FSDP's collectives between the ranks
// of one host. See Note [Collectives through shared memory] in shm_collectives.cpp: the same
// segment, slots, announcements and waits as the all-reduce, in rounds of a slot each.
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "shm_collectives.h"
#include "shm_sum.h"

namespace lockstep::dist {

bool ShmCollectives::accepts_all_gather(const torch::Tensor& output, const torch::Tensor& input) {
  return accepts_broadcast(output) && accepts_broadcast(input) && output.scalar_type() == input.scalar_type();
}

bool ShmCollectives::accepts_reduce_scatter(const torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  const auto dtype = input.scalar_type();
  const bool wide = dtype == torch::kFloat || dtype == torch::kDouble;
  return accepts(input, ReduceOp::kSum) && accepts(output, ReduceOp::kSum) && output.scalar_type() == dtype &&
         (op == ReduceOp::kSum || (op == ReduceOp::kMean && wide));
}

c10::intrusive_ptr<c10d::Work> ShmCollectives::all_gather(const torch::Tensor& output, const torch::Tensor& input,
                                                          When when) {
  Job job;
  job.kind = Kind::kAllGather;
  job.tensor = input;
  job.output = output;
  return enqueue(std::move(job), c10d::OpType::ALLGATHER, when);
}

c10::intrusive_ptr<c10d::Work> ShmCollectives::reduce_scatter(const torch::Tensor& output, const torch::Tensor& input,
                                                              std::vector<int64_t> counts, When when) {
  Job job;
  job.kind = Kind::kReduceScatter;
  job.tensor = input;
  job.output = output;
  job.counts = std::move(counts);
  return enqueue(std::move(job), c10d::OpType::REDUCE_SCATTER, when);
}

// Per round: every rank copies the round's piece of its input into its slot; all wait for all;
// every rank copies every slot into its place in the output; all wait for all (a slot is refilled
// only after everyone has copied from it).
void ShmCollectives::run_all_gather(const Job& job) {
  const auto* in = static_cast<const char*>(job.tensor.data_ptr());
  auto* out = static_cast<char*>(job.output.data_ptr());
  const int64_t part = static_cast<int64_t>(job.tensor.nbytes());  // bytes of each rank's input
  const int64_t rounds = std::max<int64_t>(1, (part + ShmSegment::kSlotBytes - 1) / ShmSegment::kSlotBytes);
  for (int64_t c = 0; c < rounds; ++c) {
    const int64_t offset = c * ShmSegment::kSlotBytes;
    const auto bytes = static_cast<size_t>(std::min(ShmSegment::kSlotBytes, part - offset));
    std::memcpy(segment_->slot(rank_), in + offset, bytes);
    if (c == 0) describe(job);
    announce();
    await_all(job, c, rounds, "its part");
    if (c == 0) check_shapes(job);
    for (int64_t r = 0; r < size_; ++r) std::memcpy(out + r * part + offset, segment_->slot(r), bytes);
    announce();
    await_all(job, c, rounds, "its copy of every part");
  }
}

// Each slot holds N segments of `per` elements per round: segment r of rank q's slot is the
// round's piece of q's input part for rank r. Rank r sums segment r over the slots, ranks in
// order, into its output. Uneven counts: a part shorter than the round leaves its segment's tail
// unused.
void ShmCollectives::run_reduce_scatter(const Job& job) {
  const auto* in = static_cast<const char*>(job.tensor.data_ptr());
  auto* out = static_cast<char*>(job.output.data_ptr());
  const int64_t element = static_cast<int64_t>(job.tensor.element_size());
  const int64_t per = ShmSegment::kSlotBytes / element / size_;
  std::vector<int64_t> starts(static_cast<size_t>(size_), 0);  // each part's first element in the input
  std::partial_sum(job.counts.begin(), job.counts.end() - 1, starts.begin() + 1);
  const int64_t longest = *std::max_element(job.counts.begin(), job.counts.end());
  const int64_t rounds = std::max<int64_t>(1, (longest + per - 1) / per);
  const auto piece = [&](int64_t r, int64_t begin) { return std::clamp<int64_t>(job.counts[r] - begin, 0, per); };
  for (int64_t c = 0; c < rounds; ++c) {
    const int64_t begin = c * per;
    for (int64_t r = 0; r < size_; ++r) {
      if (piece(r, begin) == 0) continue;  // an empty part: its input may have no storage at all
      std::memcpy(segment_->slot(rank_) + r * per * element, in + (starts[r] + begin) * element,
                  static_cast<size_t>(piece(r, begin) * element));
    }
    if (c == 0) describe(job);
    announce();
    await_all(job, c, rounds, "its input");
    if (c == 0) check_shapes(job);
    std::vector<const void*> slices;
    for (int64_t q = 0; q < size_; ++q) slices.push_back(segment_->slot(q) + rank_ * per * element);
    shm::sum_slices(job.tensor.scalar_type(), out + begin * element, slices, piece(rank_, begin));
    announce();
    await_all(job, c, rounds, "its sum of its part");
  }
}

}  // namespace lockstep::dist
