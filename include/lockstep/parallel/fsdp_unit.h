#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/dist/process_group.h"
#include "lockstep/models/classifier.h"
#include "lockstep/parallel/flat_parameters.h"
#include "lockstep/parallel/shard_reducer.h"

namespace lockstep::parallel {

// Note [FSDP units]
// FSDP (ZeRO stage 3) shards the parameters too. The model is cut into units, consecutive blocks
// of its forward (Note [Model blocks]); each unit's parameters are laid out as one flat buffer of
// N x S_u fp32 elements (Note [Flat parameters and shards]), every parameter a view of its range,
// and rank r keeps only its shard [r*S_u, (r+1)*S_u) as a tensor of its own, the one the
// optimizer steps. Between uses the flat buffer's storage is resized to 0 bytes: the parameters
// keep their shapes but hold no memory. gather() resizes the storage back and all-gathers the
// shards into it; reshard() frees it again. Resizing the storage in place, rather than pointing
// the parameters at new tensors, matters for backward: the tensors autograd saved in forward
// (a Linear's weight, a convolution's) are views of that same storage, so freeing it after
// forward frees them too, and gathering it before the unit's backward refills them.
// The schedule (FsdpStrategy drives it):
//   forward:  gather() before the unit's first block; after its last block, reshard() (with
//             reshard_after_forward, and always without grad mode) and a hook on the unit's
//             output gradient that gather()s the unit again when its backward starts.
//   backward: a ShardReducer over the unit's layout (Note [Reducing gradients into shards]) takes
//             each parameter's gradient as autograd produces it, reduce-scatters the unit's
//             gradient into this rank's grad_shard() (adding: micro-batches accumulate) and, once
//             the unit's last bucket is reduced, reshard()s the unit: every parameter of the unit
//             has its gradient by then, so no operation of its backward still needs the weights.
// Bytes sent per step and rank: (N-1)/N x 4 x Psi three times (all-gather in forward, again in
// backward, reduce-scatter), the ZeRO paper's 3Psi for stage 3. A unit's frozen parameters are
// not in its flat buffer (Note [Frozen parameters]): they stay whole through reshard(), and a
// block whose parameters are all frozen is in no unit.
class FsdpUnit {
 public:
  // `params`: the unit's trainable fp32 parameters in layout order, of a model with
  // `model_param_count` parameters; `bucket_cap_bytes` caps the gradient buckets. Leaves the unit
  // resharded.
  FsdpUnit(std::string name, const std::vector<IndexedParameter>& params, int64_t model_param_count,
           dist::ProcessGroup& group, int64_t bucket_cap_bytes);
  ~FsdpUnit();
  FsdpUnit(const FsdpUnit&) = delete;
  FsdpUnit& operator=(const FsdpUnit&) = delete;

  const std::string& name() const { return name_; }
  const FlatParameters& flat() const { return *flat_; }
  // (S) fp32, this rank's shard of the unit's parameters: what the optimizer steps. Its .grad is
  // grad_shard(), (S) fp32, the shard's gradient averaged over ranks.
  const torch::Tensor& shard() const { return shard_; }
  const torch::Tensor& grad_shard() const { return grad_shard_; }
  // Bytes of the gathered parameters, N x S x 4: what gather() allocates.
  int64_t full_bytes() const { return flat_->padded_numel() * 4; }
  bool gathered() const { return gathered_; }

  // Collective over the group (every rank, same order); nothing when already gathered. gather()
  // returns with the parameters in place; prefetch() only starts the all-gather, and the next
  // gather() (or reshard()) waits for it (Note [FSDP prefetch]).
  void gather();
  void prefetch();
  void reshard();

 private:
  std::string name_;
  dist::ProcessGroup& group_;
  std::unique_ptr<FlatParameters> flat_;
  torch::Tensor shard_;
  torch::Tensor grad_shard_;
  std::unique_ptr<ShardReducer> reducer_;
  bool gathered_ = true;
  c10::intrusive_ptr<c10d::Work> pending_;  // a prefetch's all-gather, until waited for
};

// A unit to build: its name ("layer1.0", or "layer1.0+layer1.1" when blocks are joined), its
// blocks and its trainable parameters in layout order (Note [Frozen parameters]: the frozen ones
// stay whole outside the unit's flat buffer).
struct UnitPlan {
  std::string name;
  std::vector<std::string> blocks;
  std::vector<IndexedParameter> params;
};

// The fsdp strategy's units of `module` (FsdpOptions::min_params): consecutive blocks joined until
// they hold min_params parameters; a short tail joins the unit before it. Every parameter must be
// in a block, and the units must list them in the model's order (the per-parameter layout of saved
// optimizer state). Only trainable parameters count and are planned; a plan left without any
// builds no unit, and its blocks run as they are, with nothing to gather. A parameter that several
// blocks use (gpt-mini's tied embedding: its first block and its last) keeps the unit of its first
// use open through its last, so one unit holds it and every use sees it gathered, as PyTorch's
// FSDP puts a shared parameter in the smallest wrapper around all its users. Also what a memory
// plan lays out (train/memory_plan.h). Throws c10::ValueError naming `rank` and the parameter when
// the blocks do not hold every parameter once, in order.
std::vector<UnitPlan> plan_units(torch::nn::Module& module, const std::vector<models::Block>& blocks,
                                 int64_t min_params, int64_t rank);

}  // namespace lockstep::parallel
