#pragma once

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "lockstep/dist/process_group.h"
#include "lockstep/models/norm_layer.h"

namespace lockstep::parallel {

// Note [SyncBatchNorm]
// Batch normalisation over the global batch: the concatenation of every rank's batch, whatever
// its size on each rank (zero included). In training, each rank sums per channel its count, sum
// and sum of squares in one pass over the input as it lies in memory (channels-first or
// channels-last; PyTorch's batch_norm_stats kernels have no CPU version), and one all-reduce of
// those 2C+1 numbers gives every rank the global mean and biased variance. The sums are kept in
// fp64 (local sums and the all-reduce, (2C+1) x 8 bytes): E[x^2] - E[x]^2 loses (mean/std)^2 x
// the precision of its type, which fp32 cannot spare. A custom autograd function normalises, by
// LibTorch's inference batch norm given the global mean and variance (one pass, (x - mean)
// first); its backward takes the two per-channel sums the input gradient needs (sum of dy, sum of
// dy * x_hat) from LibTorch's batch-norm backward reduction (accumulated as LibTorch's BatchNorm
// accumulates its own), all-reduces them in fp64 over the global batch, forms the input gradient
// in two passes (the x_hat term as another inference batch norm, then + dy x scale), and returns
// weight and bias gradients of this rank's samples only, as PyTorch's does: DDP then averages
// them. The element-wise work is then that of BatchNorm itself: the first version, in plain
// tensor ops, made about ten passes over each activation, an fp64 copy among them, and ran the
// convnet's DDP step at half of plain BatchNorm's speed.
// The convnet's training blocks run BatchNorm, ReLU and the max-pool as one function (Note
// [BatchNorm, ReLU and the max-pool as one function in training], src/models/norm_relu_pool.cpp);
// with a SyncBatchNorm it sums the same numbers, fp64 and unshifted, through sum_over_ranks at the
// same two places (models::SumsOverRanks), so a rank on that path and a rank on this one pair up.
// Running statistics follow PyTorch's BatchNorm (momentum, or the cumulative average without
// one; the unbiased variance), computed from the same global numbers on every rank, so they stay
// identical without a broadcast (DistributedDataParallel skips SyncBatchNorm's buffers).
// Eval mode (and a group of one rank) runs BatchNorm itself on the local batch, with no
// communication: running statistics, or without them the local batch's. Every rank must run the
// same number of training forwards and backwards through each layer (the collectives pair up
// across ranks), as with PyTorch's.
// SyncBatchNorm{1,2,3}dImpl derive from BatchNorm{1,2,3}dImpl, as Python's SyncBatchNorm is a
// _BatchNorm: everything that treats batch norm specially (amp keeps it fp32 at O2, state dicts,
// input-dimension checks) treats it the same. It must be called through its own type (or an
// AnyModule made from it): BatchNorm's forward is not virtual.
template <typename BatchNormImpl>
class SyncBatchNormImpl : public BatchNormImpl, public models::SumsOverRanks {
 public:
  // `group` must outlive the module; its ranks must all hold this layer.
  SyncBatchNormImpl(const torch::nn::BatchNormOptions& options, dist::ProcessGroup& group);

  // x: (N, C, ...) with N >= 0 on this rank; -> x's shape and dtype (bf16 at O2 and O3, as
  // BatchNorm's). Statistics in fp64 and normalisation in fp32 whatever x's dtype.
  torch::Tensor forward(const torch::Tensor& x);

  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override;
  void pretty_print(std::ostream& stream) const override;

  dist::ProcessGroup& group() const { return *group_; }

  // The forward's (2C+1) sums (count, sum, sum of squares per channel) and the backward's (2C)
  // (sum of dy, sum of dy x_hat), all-reduced; nothing with one rank.
  void sum_over_ranks(torch::Tensor& values) const override;
  std::string rank_description() const override;

 private:
  dist::ProcessGroup* group_;
};

extern template class SyncBatchNormImpl<torch::nn::BatchNorm1dImpl>;
extern template class SyncBatchNormImpl<torch::nn::BatchNorm2dImpl>;
extern template class SyncBatchNormImpl<torch::nn::BatchNorm3dImpl>;

using SyncBatchNorm1dImpl = SyncBatchNormImpl<torch::nn::BatchNorm1dImpl>;
using SyncBatchNorm2dImpl = SyncBatchNormImpl<torch::nn::BatchNorm2dImpl>;
using SyncBatchNorm3dImpl = SyncBatchNormImpl<torch::nn::BatchNorm3dImpl>;
TORCH_MODULE_IMPL(SyncBatchNorm1d, SyncBatchNorm1dImpl);
TORCH_MODULE_IMPL(SyncBatchNorm2d, SyncBatchNorm2dImpl);
TORCH_MODULE_IMPL(SyncBatchNorm3d, SyncBatchNorm3dImpl);

// Whether `module` is one of the SyncBatchNorm layers.
bool is_sync_batch_norm(const torch::nn::Module& module);

// A norm layer factory (see Note [Norm layer factory]) building SyncBatchNorm2d over `group`:
// models::make_model(name, classes, sync_batch_norm_layer(group)).
models::NormLayer sync_batch_norm_layer(dist::ProcessGroup& group);

// Apex's convert_syncbn_model / PyTorch's SyncBatchNorm.convert_sync_batchnorm: every
// BatchNorm{1,2,3}d in `module`'s tree becomes the SyncBatchNorm of the same dimension over
// `group`, with the same options, training mode, requires_grad flags and values of weight, bias,
// running_mean, running_var and num_batches_tracked (copies: convert before building the
// optimizer). `module` itself is replaced when it is a BatchNorm, and layers inside a Sequential
// in place (its list and its registered children). A BatchNorm held by any other module is
// called through that module's own member, which no conversion can reach: that throws naming the
// layer, before anything is changed, and says to build the model with sync_batch_norm_layer.
// Returns the converted module (`module` itself unless it was a BatchNorm).
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          dist::ProcessGroup& group);

}  // namespace lockstep::parallel
