#pragma once
// A memory plan's arithmetic over a strategy's layout (see Note [Planning memory]): shards, the
// gradient buckets the strategies cut, the collectives' own tensors and the optimizer's state, by
// the same rules as the code that allocates them.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "lockstep/parallel/strategy.h"

namespace lockstep::train {

// zero2's and fsdp's reduce-scatter buckets (ZeroOptions::bucket_cap_mb, fsdp's kBucketCapBytes).
constexpr int64_t kShardBucketCapBytes = 25 * 1024 * 1024;

// Elements of one rank's shard of `numel` elements over `world` ranks (padded up).
int64_t shard_numel(int64_t numel, int64_t world);

// The largest gradient bucket, in bytes, of a flat fp32 buffer holding `numels` (in the layout's
// order) padded to `padded` elements, by ShardReducer's rule (Note [Reducing gradients into
// shards]): parameters in reverse order, the first bucket ending at the padding, a bucket closing
// once it holds kShardBucketCapBytes or more. A bucket can exceed the cap by one parameter:
// mlp-wide's fc1 and fc2 (12.25 and 16 MiB) make one 28.3 MiB bucket, not a 25 MiB one.
int64_t largest_bucket_bytes(const std::vector<int64_t>& numels, int64_t padded);
// The most those buckets hold at once through shared memory, where a bucket's reduce_scatter
// runs while the next fills: a bucket's staging and its reduced part (1/world of it) beside the
// staging of the bucket after it, or the largest bucket alone.
int64_t buckets_in_flight_bytes(const std::vector<int64_t>& numels, int64_t padded, int64_t world);

// Bytes ddp's bf16 gradient buckets hold in their all-gathers at the end of backward, on `world`
// ranks, for trainable parameters `trained` ((elements, dtype), in the model's order). See Note
// [Gradient buckets]: the reducer cuts buckets per dtype in reverse order (the first at 1 MiB,
// then at DistributedDataParallelOptions::bucket_cap_mb, 25 MiB); Gloo has no bf16 all-reduce, so
// a bf16 bucket is all-gathered instead: `world` received copies, kept until backward's last
// bucket is summed, and Gloo's own flat output of as many bytes while it runs. Every bucket is in
// flight at the end of backward: 2 x world x the bf16 buckets' bytes. Other dtypes are all-reduced
// in place (0).
int64_t ddp_all_gather_bytes(const std::vector<std::pair<int64_t, c10::ScalarType>>& trained, int64_t world);

// The pages of the process group's shared-memory segment a rank touches (Note [Collectives through
// shared memory]): one slot of dist::ShmSegment::kSlotBytes per rank and a result slot, each
// filled up to the largest message of a step's collectives, which carry at most the model's
// parameters or gradients (`model_bytes`); its control lines are one page.
int64_t shared_segment_bytes(int64_t world, int64_t model_bytes);

// The optimizer's state over tensors of `shapes` after one step, in bytes.
int64_t optimizer_bytes(const parallel::OptimizerFactory& make, const std::vector<std::vector<int64_t>>& shapes);

}  // namespace lockstep::train
