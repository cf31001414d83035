#include "lockstep/data/bucket_batch_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>

namespace lockstep::data {

namespace {

// A permutation of [0, n) from torch's CPU generator seeded with `seed`, as DistributedSampler's.
std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const torch::Tensor p = torch::randperm(n, gen, torch::kInt64);
  return {p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + n};
}

}  // namespace

const std::vector<std::string>& overlength_policy_names() {
  static const std::vector<std::string> names{"truncate", "drop"};
  return names;
}

double padding_fraction(const std::vector<Batch>& batches) {
  int64_t real = 0, padded = 0;
  for (const Batch& b : batches) real += b.tokens, padded += b.padded_tokens();
  return padded == 0 ? 0.0 : 1.0 - static_cast<double>(real) / static_cast<double>(padded);
}

BucketBatchSampler::BucketBatchSampler(std::vector<int64_t> lengths, BucketBatchSamplerOptions options)
    : lengths_(std::move(lengths)), options_(options) {
  const auto& o = options_;
  TORCH_CHECK_VALUE(o.num_replicas() >= 1, "BucketBatchSampler: num_replicas=", o.num_replicas(), " must be at least 1");
  TORCH_CHECK_VALUE(o.rank() >= 0 && o.rank() < o.num_replicas(), "BucketBatchSampler: rank=", o.rank(),
                    " must be in [0, ", o.num_replicas() - 1, "] for num_replicas=", o.num_replicas());
  TORCH_CHECK_VALUE(o.max_length() >= 1, "BucketBatchSampler: max_length=", o.max_length(), " must be at least 1 token");
  TORCH_CHECK_VALUE(o.sort_size() >= 0, "BucketBatchSampler: sort_size=", o.sort_size(),
                    " must be at least 1 (or 0 for 1024 x num_replicas)");
  if (o.sort_size() == 0) options_.sort_size(1024 * o.num_replicas());
  int64_t longest = 0;
  for (size_t i = 0; i < lengths_.size(); ++i) {
    TORCH_CHECK_VALUE(lengths_[i] >= 0, "BucketBatchSampler: sequence ", i, " has length ", lengths_[i]);
    if (lengths_[i] == 0) continue;  // nothing to train on
    if (lengths_[i] > o.max_length() && o.overlength() == OverlengthPolicy::kDrop) continue;
    kept_.push_back(static_cast<int64_t>(i));
    longest = std::max(longest, std::min(lengths_[i], o.max_length()));
  }
  TORCH_CHECK_VALUE(!kept_.empty(), "BucketBatchSampler: none of the ", lengths_.size(), " sequences is kept (empty ",
                    "ones are skipped, and with overlength=drop those over max_length=", o.max_length(),
                    "); raise max_length or use overlength=truncate");
  TORCH_CHECK_VALUE(o.max_tokens() >= longest, "BucketBatchSampler: max_tokens=", o.max_tokens(),
                    " is smaller than one sequence of ", longest, " tokens (max_length=", o.max_length(),
                    "); raise max_tokens to at least ", longest, " or lower max_length");
  if (o.drop_last()) {
    const auto batches = static_cast<int64_t>(epoch_batches(0).size());
    TORCH_CHECK_VALUE(batches >= o.num_replicas(), "BucketBatchSampler: with drop_last, the ", batches,
                      " batches of epoch 0 leave none for some of the ", o.num_replicas(),
                      " ranks; lower max_tokens or turn drop_last off");
  }
  set_epoch(0);
}

std::vector<Batch> BucketBatchSampler::epoch_batches(int64_t epoch) const {
  const auto& o = options_;
  const uint64_t seed = o.seed() + static_cast<uint64_t>(epoch);
  std::vector<int64_t> order = kept_;
  if (o.shuffle()) {
    const auto p = permutation(static_cast<int64_t>(kept_.size()), seed);
    for (size_t i = 0; i < p.size(); ++i) order[i] = kept_[static_cast<size_t>(p[i])];
  }
  const auto length = [&](int64_t i) { return std::min(lengths_[static_cast<size_t>(i)], o.max_length()); };
  std::vector<Batch> batches;
  for (size_t chunk = 0; chunk < order.size(); chunk += static_cast<size_t>(o.sort_size())) {
    const auto begin = order.begin() + static_cast<std::ptrdiff_t>(chunk);
    const auto end = order.begin() + static_cast<std::ptrdiff_t>(std::min(order.size(), chunk + static_cast<size_t>(o.sort_size())));
    std::stable_sort(begin, end, [&](int64_t a, int64_t b) { return length(a) < length(b); });
    Batch batch;
    for (auto it = begin; it != end; ++it) {
      const int64_t len = length(*it);  // the longest so far, since the chunk is sorted
      if (!batch.indices.empty() && len * static_cast<int64_t>(batch.indices.size() + 1) > o.max_tokens()) {
        batches.push_back(std::move(batch));
        batch = Batch();
      }
      batch.indices.push_back(*it);
      batch.length = len;
      batch.tokens += len;
    }
    if (!batch.indices.empty()) batches.push_back(std::move(batch));
  }
  if (o.shuffle()) {
    // A second draw from the epoch's seed: the same on every rank, independent of the first.
    const auto p = permutation(static_cast<int64_t>(batches.size()), seed ^ 0x9E3779B97F4A7C15ull);
    std::vector<Batch> shuffled;
    shuffled.reserve(batches.size());
    for (const int64_t i : p) shuffled.push_back(std::move(batches[static_cast<size_t>(i)]));
    batches = std::move(shuffled);
  }
  return batches;
}

std::vector<Batch> BucketBatchSampler::global_batches(int64_t epoch) const {
  std::vector<Batch> all = epoch_batches(epoch);
  const auto world = static_cast<size_t>(options_.num_replicas());
  const size_t n = all.size();
  const size_t total = options_.drop_last() ? n / world * world : (n + world - 1) / world * world;
  all.reserve(total);
  for (size_t i = n; i < total; ++i) all.push_back(all[i % n]);  // pad by repeating the head
  all.resize(total);
  return all;
}

std::vector<Batch> BucketBatchSampler::rank_batches(int64_t epoch) const {
  const std::vector<Batch> all = global_batches(epoch);
  std::vector<Batch> mine;
  for (size_t i = static_cast<size_t>(options_.rank()); i < all.size(); i += static_cast<size_t>(options_.num_replicas()))
    mine.push_back(all[i]);
  return mine;
}

void BucketBatchSampler::set_epoch(int64_t epoch) { load_state({epoch, 0}); }

void BucketBatchSampler::load_state(const State& state) {
  TORCH_CHECK_VALUE(state.epoch >= 0 && state.next_batch >= 0, "BucketBatchSampler: cannot resume at epoch ",
                    state.epoch, ", batch ", state.next_batch);
  if (current_.empty() || state.epoch != state_.epoch) current_ = rank_batches(state.epoch);
  TORCH_CHECK_VALUE(state.next_batch <= num_batches(), "BucketBatchSampler: cannot resume at batch ", state.next_batch,
                    " of epoch ", state.epoch, ", which has ", num_batches(), " batches on rank ", options_.rank(),
                    "; was the state saved with other lengths or options?");
  state_ = state;
}

std::optional<Batch> BucketBatchSampler::next() {
  if (state_.next_batch >= num_batches()) return std::nullopt;
  return current_[static_cast<size_t>(state_.next_batch++)];
}

}  // namespace lockstep::data
