#include "lockstep/parallel/shard_reducer.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>

namespace lockstep::parallel {

using torch::autograd::variable_list;

ShardReducer::ShardReducer(const FlatParameters& flat, torch::Tensor grad_shard, dist::ProcessGroup& group,
                           int64_t bucket_cap_bytes, std::function<void()> reduced)
    : flat_(flat),
      grad_shard_(std::move(grad_shard)),
      group_(group),
      world_(torch::scalar_tensor(static_cast<double>(group.size()), torch::kFloat)),
      reduced_(std::move(reduced)) {
  TORCH_CHECK_VALUE(bucket_cap_bytes > 0, "the gradient bucket cap must be positive, got ", bucket_cap_bytes, " bytes");
  const auto& params = flat_.params();
  const int64_t n = static_cast<int64_t>(params.size());
  bucket_of_.assign(n, -1);
  ready_.assign(n, false);
  // See Note [Reducing gradients into shards]: reverse order, the first bucket ending at the padding.
  Bucket open;
  open.end = flat_.padded_numel();
  for (int64_t i = n - 1; i >= 0; --i) {
    open.params.push_back(i);
    open.begin = flat_.offsets()[i];
    bucket_of_[i] = static_cast<int64_t>(buckets_.size());
    if ((open.end - open.begin) * 4 >= bucket_cap_bytes || i == 0) {
      buckets_.push_back(open);
      open = Bucket();
      open.end = flat_.offsets()[i];
    }
  }
  for (Bucket& b : buckets_) b.pending = static_cast<int64_t>(b.params.size());

  for (int64_t i = 0; i < n; ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    TORCH_INTERNAL_ASSERT(acc, "parameter ", flat_.names()[i], " has no gradient accumulator");
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const variable_list& outputs, const variable_list& /*inputs*/) {
          on_gradient(i);
          return outputs;
        })));
    accumulators_.push_back(std::move(acc));
  }
}

ShardReducer::~ShardReducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

int64_t ShardReducer::largest_bucket_bytes() const {
  int64_t largest = 0;
  for (const Bucket& b : buckets_) largest = std::max(largest, (b.end - b.begin) * 4);
  return largest;
}

void ShardReducer::on_gradient(int64_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) {
    armed_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
  }
  if (ready_[index]) return;
  ready_[index] = true;
  torch::Tensor p = flat_.params()[index];
  Bucket& b = buckets_[bucket_of_[index]];
  if (!b.staging.defined()) b.staging = torch::zeros({b.end - b.begin}, torch::kFloat);
  torch::NoGradGuard no_grad;
  if (p.grad().defined()) {
    torch::Tensor dst = b.staging.narrow(0, flat_.offsets()[index] - b.begin, p.numel());
    torch::div_out(dst, p.grad().reshape({-1}), world_);
    p.mutable_grad() = torch::Tensor();  // released: this rank keeps only its shard's gradient
  }
  if (--b.pending == 0) launch_ready_buckets();
}

void ShardReducer::launch_ready_buckets() {
  const int64_t rank = group_.rank();
  const int64_t shard_begin = flat_.shard_begin(rank);
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& b = buckets_[next_bucket_];
    if (!b.staging.defined()) b.staging = torch::zeros({b.end - b.begin}, torch::kFloat);
    const std::vector<int64_t> counts = flat_.shard_counts(b.begin, b.end);
    land_in_flight();
    InFlight next;
    next.reduced = torch::empty({counts[rank]}, torch::kFloat);
    next.staging = std::move(b.staging);
    next.shard_offset = std::max(b.begin, shard_begin) - shard_begin;
    next.work = group_.reduce_scatter_async(next.reduced, next.staging, counts);
    in_flight_ = std::move(next);
    if (++next_bucket_ == buckets_.size() && reduced_) reduced_();
  }
}

void ShardReducer::land_in_flight() {
  if (!in_flight_) return;
  group_.wait(in_flight_->work, "reduce_scatter of a gradient bucket");
  torch::NoGradGuard no_grad;
  if (in_flight_->reduced.numel() > 0)
    grad_shard_.narrow(0, in_flight_->shard_offset, in_flight_->reduced.numel()).add_(in_flight_->reduced);
  in_flight_.reset();
}

// Runs when backward ends: parameters that got no gradient count as zeros, so every bucket is
// reduced on every rank, then the buckets are reset for the next backward.
void ShardReducer::finalize() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < ready_.size(); ++i) {
    if (ready_[i]) continue;
    ready_[i] = true;
    --buckets_[bucket_of_[i]].pending;
  }
  launch_ready_buckets();
  land_in_flight();
  std::fill(ready_.begin(), ready_.end(), false);
  for (Bucket& b : buckets_) b.pending = static_cast<int64_t>(b.params.size());
  next_bucket_ = 0;
  armed_ = false;
}

}  // namespace lockstep::parallel
