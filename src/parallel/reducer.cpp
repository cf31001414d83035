#include "lockstep/parallel/reducer.h"

#include <c10/util/StringUtil.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <chrono>
#include <unordered_set>

namespace lockstep::parallel {
namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

torch::ScalarType wire_dtype(CommHook hook, torch::ScalarType dtype) {
  switch (hook) {
    case CommHook::kBf16Compress: return torch::kBFloat16;
    case CommHook::kFp16Compress: return torch::kFloat16;
    default: return dtype;
  }
}

}  // namespace

Reducer::Reducer(std::vector<torch::Tensor> params, std::vector<std::string> names,
                 dist::ProcessGroup& group, ReducerOptions options)
    : params_(std::move(params)), names_(std::move(names)), group_(group), options_(options) {
  TORCH_CHECK_VALUE(options_.bucket_cap_bytes > 0, "bucket_cap_mb must be positive, got ",
                    options_.bucket_cap_bytes, " bytes");
  const int64_t n = static_cast<int64_t>(params_.size());
  bucket_of_.assign(n, -1);
  slot_of_.assign(n, -1);
  ready_.assign(n, false);
  unused_.assign(n, false);
  locally_used_ = torch::zeros({n}, torch::kInt32);

  // See Note [Gradient buckets]. One open bucket per dtype; reverse registration order.
  std::map<torch::ScalarType, Bucket> open;
  std::map<torch::ScalarType, int64_t> open_bytes;
  auto close = [&](torch::ScalarType dtype) {
    Bucket& b = open[dtype];
    if (b.params.empty()) return;
    int64_t numel = 0;
    for (int64_t i : b.params) numel += params_[i].numel();
    b.flat = torch::zeros({numel}, params_[b.params[0]].options());
    b.world = torch::scalar_tensor(static_cast<double>(group_.size()), b.flat.options());
    for (size_t s = 0; s < b.params.size(); ++s) {
      bucket_of_[b.params[s]] = static_cast<int64_t>(buckets_.size());
      slot_of_[b.params[s]] = static_cast<int64_t>(s);
    }
    buckets_.push_back(std::move(b));
    open.erase(dtype);
    open_bytes.erase(dtype);
  };
  for (int64_t i = n - 1; i >= 0; --i) {
    const torch::Tensor& p = params_[i];
    const auto dtype = p.scalar_type();
    Bucket& b = open[dtype];
    b.offsets.push_back(b.params.empty() ? 0 : b.offsets.back() + params_[b.params.back()].numel());
    b.params.push_back(i);
    open_bytes[dtype] += p.numel() * static_cast<int64_t>(p.element_size());
    const int64_t cap = buckets_.empty() ? options_.first_bucket_cap_bytes : options_.bucket_cap_bytes;
    if (open_bytes[dtype] >= cap) close(dtype);
  }
  while (!open.empty()) close(open.begin()->first);
  for (const Bucket& b : buckets_) stats_.buckets.push_back(b.params);
  stats_.hooks_before_launch.assign(buckets_.size(), 0);
  reset();

  for (int64_t i = 0; i < n; ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    TORCH_INTERNAL_ASSERT(acc, "parameter ", names_[i], " has no gradient accumulator");
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const variable_list& outputs, const variable_list& /*inputs*/) {
          on_gradient(i);
          return outputs;
        })));
    accumulators_.push_back(std::move(acc));
  }
}

Reducer::~Reducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void Reducer::reset() {
  std::fill(ready_.begin(), ready_.end(), false);
  locally_used_.zero_();
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int64_t>(b.params.size());
    b.work.reset();
  }
  next_bucket_ = 0;
  hooks_ = 0;
  armed_ = false;
}

void Reducer::prepare_for_backward(const std::vector<torch::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::fill(unused_.begin(), unused_.end(), false);
  if (!options_.find_unused_parameters) return;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (const auto& out : outputs)
    if (out.defined() && out.grad_fn()) stack.push_back(out.grad_fn().get());
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges())
      if (edge.function) stack.push_back(edge.function.get());
  }
  for (size_t i = 0; i < params_.size(); ++i) unused_[i] = seen.count(accumulators_[i].get()) == 0;
}

void Reducer::on_gradient(int64_t index) {
  if (!sync_) return;  // no_sync(): the gradient stays in .grad, accumulated locally
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) {
    armed_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
    for (size_t i = 0; i < params_.size(); ++i)
      if (unused_[i]) mark_ready(static_cast<int64_t>(i), /*used=*/false);
  }
  ++hooks_;
  mark_ready(index, /*used=*/true);
}

void Reducer::mark_ready(int64_t index, bool used) {
  if (ready_[index]) return;
  ready_[index] = true;
  Bucket& b = buckets_[bucket_of_[index]];
  const int64_t slot = slot_of_[index];
  torch::Tensor dst = b.flat.narrow(0, b.offsets[slot], params_[index].numel());
  torch::Tensor& param = params_[index];
  const bool in_bucket = param.grad().defined() && param.grad().is_alias_of(b.flat);
  if (used && param.grad().defined()) {
    // Divided on the way into the bucket, before the sum (as PyTorch does): one pass, and 16-bit
    // wire values stay in range. See Note [Gradients as bucket views].
    if (in_bucket) {
      dst.div_(b.world);
    } else {
      torch::div_out(dst, param.grad().reshape(-1), b.world);
      if (options_.gradient_as_bucket_view) param.mutable_grad() = dst.view(param.sizes()).detach();
    }
    locally_used_.data_ptr<int32_t>()[index] = 1;
  } else {
    if (in_bucket) param.mutable_grad() = param.grad().clone();
    dst.zero_();
  }
  if (--b.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& b = buckets_[next_bucket_];
    stats_.hooks_before_launch[next_bucket_] = hooks_;
    const auto dtype = wire_dtype(options_.comm_hook, b.flat.scalar_type());
    b.wire = dtype == b.flat.scalar_type() ? b.flat : b.flat.to(dtype);
    if (dtype == torch::kBFloat16) {
      b.work = group_.all_gather_async(b.wire.view(torch::kHalf), b.gathered);
    } else {
      b.work = group_.all_reduce_async(b.wire);
    }
    ++next_bucket_;
  }
}

void Reducer::finalize() {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> missing;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (options_.find_unused_parameters) {
      mark_ready(static_cast<int64_t>(i), /*used=*/false);
    } else {
      missing.push_back(names_[i]);
    }
  }
  if (!missing.empty()) {
    const auto rank = group_.rank();
    for (Bucket& b : buckets_)
      if (b.work) group_.wait(b.work, "DDP gradient all-reduce");
    reset();
    TORCH_CHECK(false, "rank ", rank, ": DistributedDataParallel got no gradient for parameter(s) ",
                c10::Join(", ", missing), " in this backward, so their buckets cannot be reduced. ",
                "If the model legitimately leaves parameters unused, construct it with ",
                "DistributedDataParallelOptions().find_unused_parameters(true)");
  }
  torch::Tensor used;
  if (options_.find_unused_parameters) {
    used = locally_used_.clone();
    group_.all_reduce(used);  // a parameter unused on every rank keeps its .grad untouched
  }
  const int32_t* used_by = used.defined() ? used.data_ptr<int32_t>() : nullptr;
  for (Bucket& b : buckets_) {
    group_.wait(b.work, "DDP gradient all-reduce");
    if (!b.gathered.empty()) {
      b.flat.zero_();
      for (const auto& words : b.gathered) b.flat.add_(words.view(torch::kBFloat16).to(b.flat.scalar_type()));
      b.gathered.clear();
    } else if (!b.wire.is_same(b.flat)) {
      b.flat.copy_(b.wire);
    }
    for (size_t s = 0; s < b.params.size(); ++s) {
      const int64_t i = b.params[s];
      if (used_by != nullptr && used_by[i] == 0) continue;
      torch::Tensor& p = params_[i];
      if (p.grad().defined() && p.grad().is_alias_of(b.flat)) continue;  // the average is in place
      torch::Tensor avg = b.flat.narrow(0, b.offsets[s], p.numel()).view(p.sizes());
      if (options_.gradient_as_bucket_view) {
        p.mutable_grad() = avg.detach();
      } else if (p.grad().defined()) {
        p.mutable_grad().copy_(avg);
      } else {
        p.mutable_grad() = avg.clone();
      }
    }
  }
  stats_.hooks = hooks_;
  stats_.finalize_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  reset();
}

}  // namespace lockstep::parallel
