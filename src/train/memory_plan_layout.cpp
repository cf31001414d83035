#include "memory_plan_layout.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "../dist/shm_segment.h"
#include "lockstep/optim/state_dict.h"

namespace lockstep::train {

int64_t shard_numel(int64_t numel, int64_t world) { return (numel + world - 1) / world; }

int64_t shared_segment_bytes(int64_t world, int64_t model_bytes) {
  const int64_t page = 4096;
  const int64_t per_slot = std::min(dist::ShmSegment::kSlotBytes, (model_bytes + page - 1) / page * page);
  return (world + 1) * per_slot + page;
}

namespace {

// Each bucket's bytes in the order ShardReducer fills them; see largest_bucket_bytes.
std::vector<int64_t> bucket_bytes(const std::vector<int64_t>& numels, int64_t padded) {
  std::vector<int64_t> offsets(numels.size());
  for (size_t i = 1; i < numels.size(); ++i) offsets[i] = offsets[i - 1] + numels[i - 1];
  std::vector<int64_t> out;
  int64_t end = padded;
  for (int64_t i = static_cast<int64_t>(numels.size()) - 1; i >= 0; --i) {
    if ((end - offsets[i]) * 4 >= kShardBucketCapBytes || i == 0) {
      out.push_back((end - offsets[i]) * 4);
      end = offsets[i];
    }
  }
  return out;
}

}  // namespace

int64_t largest_bucket_bytes(const std::vector<int64_t>& numels, int64_t padded) {
  const std::vector<int64_t> buckets = bucket_bytes(numels, padded);
  return buckets.empty() ? 0 : *std::max_element(buckets.begin(), buckets.end());
}

int64_t buckets_in_flight_bytes(const std::vector<int64_t>& numels, int64_t padded, int64_t world) {
  const std::vector<int64_t> buckets = bucket_bytes(numels, padded);
  int64_t most = buckets.empty() ? 0 : *std::max_element(buckets.begin(), buckets.end());
  for (size_t k = 0; k + 1 < buckets.size(); ++k)
    most = std::max(most, buckets[k] + buckets[k] / world + buckets[k + 1]);
  return most;
}

int64_t ddp_all_gather_bytes(const std::vector<std::pair<int64_t, c10::ScalarType>>& trained, int64_t world) {
  constexpr int64_t kFirstBucketCapBytes = 1024 * 1024, kBucketCapBytes = 25 * 1024 * 1024;  // Reducer's
  std::map<c10::ScalarType, int64_t> open;  // bytes of each dtype's open bucket
  int64_t closed = 0, gathered = 0;
  auto close = [&](c10::ScalarType dtype) {
    if (dtype == c10::kBFloat16) gathered += 2 * world * open[dtype];
    open.erase(dtype);
    ++closed;
  };
  for (auto it = trained.rbegin(); it != trained.rend(); ++it) {
    const auto [elements, dtype] = *it;
    open[dtype] += elements * static_cast<int64_t>(c10::elementSize(dtype));
    if (open[dtype] >= (closed == 0 ? kFirstBucketCapBytes : kBucketCapBytes)) close(dtype);
  }
  while (!open.empty()) close(open.begin()->first);
  return gathered;
}

// The optimizer's state over tensors of `shapes` after one step. Every built-in optimizer keeps a
// fixed number of tensors shaped like each parameter (momentum; Adam's two moments), so the run's
// optimizer is stepped on zero gradients over stand-ins of one and of two elements and its state
// extrapolated by elements, exact to the byte. Stepping it over the real shapes held a replica's
// weights, gradients, state and the step's temporaries at once (mlp-wide with Adam: 178 MiB in the
// check at launch, above the 150 MiB of the run's own step, and so the run's peak RSS).
int64_t optimizer_bytes(const parallel::OptimizerFactory& make, const std::vector<std::vector<int64_t>>& shapes) {
  if (shapes.empty()) return 0;
  const auto k = static_cast<int64_t>(shapes.size());
  auto state_bytes = [&](int64_t numel) {
    std::vector<torch::Tensor> params;
    for (int64_t i = 0; i < k; ++i) {
      torch::Tensor p = torch::zeros({numel}).requires_grad_();
      p.mutable_grad() = torch::zeros({numel});
      params.push_back(p);
    }
    auto optimizer = make(params);
    optimizer->step();
    return optim::optimizer_state_bytes(*optimizer);
  };
  const int64_t one = state_bytes(1), two = state_bytes(2);  // k x (fixed + e), k x (fixed + 2e)
  int64_t elements = 0;
  for (const auto& shape : shapes) elements += c10::multiply_integers(shape);
  return (2 * one - two) + (two - one) / k * elements;
}

}  // namespace lockstep::train
