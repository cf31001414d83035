#include "lockstep/parallel/fsdp_unit.h"

#include <ATen/native/Resize.h>
#include <torch/torch.h>

namespace lockstep::parallel {
namespace {

// Resizes the storage under `t` in place: every tensor sharing it (the parameters, the tensors
// autograd saved) sees the new memory. See Note [FSDP units].
void resize_storage(const torch::Tensor& t, int64_t bytes) {
  at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(), static_cast<size_t>(bytes));
}

}  // namespace

FsdpUnit::FsdpUnit(std::string name, const std::vector<IndexedParameter>& params, int64_t model_param_count,
                   dist::ProcessGroup& group, int64_t bucket_cap_bytes)
    : name_(std::move(name)),
      group_(group),
      flat_(std::make_unique<FlatParameters>(params, model_param_count, group.size(), group.rank())) {
  TORCH_CHECK_VALUE(flat_->flat().device().is_cpu(), "rank ", group.rank(), ": fsdp unit '", name_,
                    "' is on ", flat_->flat().device(), "; this build shards CPU parameters only");
  shard_ = flat_->shard().clone();
  grad_shard_ = torch::zeros_like(shard_);
  shard_.mutable_grad() = grad_shard_;
  reducer_ = std::make_unique<ShardReducer>(*flat_, grad_shard_, group_, bucket_cap_bytes, [this] { reshard(); });
  reshard();
}

FsdpUnit::~FsdpUnit() {
  try {
    reshard();  // a prefetch still running writes into the storage: wait for it first
  } catch (const std::exception&) {
    // the group failed, and said so to whoever waits on it next; nothing is left to free into
  }
}

void FsdpUnit::gather() {
  if (pending_) {
    c10::intrusive_ptr<c10d::Work> work = std::move(pending_);
    group_.wait(work, "all_gather_into (fsdp's prefetch)");
  }
  if (gathered_) return;
  torch::Tensor full = flat_->flat();
  resize_storage(full, full_bytes());
  group_.all_gather_into(full, shard_);
  gathered_ = true;
}

void FsdpUnit::prefetch() {
  if (gathered_) return;
  torch::Tensor full = flat_->flat();
  resize_storage(full, full_bytes());
  pending_ = group_.all_gather_into_async(full, shard_);
  gathered_ = true;
}

void FsdpUnit::reshard() {
  if (pending_) gather();
  if (!gathered_) return;
  resize_storage(flat_->flat(), 0);
  gathered_ = false;
}

}  // namespace lockstep::parallel
