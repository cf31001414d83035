#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::parallel {

// Note [Flat parameters and shards]
// ZeRO lays a model's parameters end to end in one flat fp32 buffer, in named_parameters()
// order, padded with zeros to N x S elements (N ranks, S = ceil(total / N)), and every parameter
// becomes a view of its range, so the buffer *is* the model's weights. Rank r owns the contiguous
// shard [r*S, (r+1)*S): its optimizer is built over one tensor, a view of that shard, whose .grad
// is the same range of the gradient averaged over ranks. SGD, Adam and AdamW are element-wise, so
// stepping the shard changes each element exactly as DDP's step would (the padding stays 0: its
// gradient is 0), and one all-gather of the shards refreshes every rank's weights. Memory divides
// evenly whatever the parameter sizes, as with DeepSpeed's flat partitions (PyTorch's
// ZeroRedundancyOptimizer hands out whole parameters instead, which cannot balance a model whose
// largest parameter exceeds 1/N of it). A parameter may straddle two shards; nothing depends on
// parameter boundaries except the per-parameter layout of saved state (unflatten / flatten).
//
// Note [Frozen parameters]
// A parameter with requires_grad false (a frozen backbone while fine-tuning) is not flattened:
// it stays whole, its own tensor, on every rank (rank 0's values, which sync_module_states
// broadcasts at start), gets no gradient, is in no shard and no shard optimizer, and so never
// changes, as DeepSpeed leaves frozen parameters out of its partitions and PyTorch's FSDP with
// use_orig_params gives them no gradient. Only the trainable parameters are laid out, in model
// order. Saved state still numbers every parameter of the model, frozen ones included, as a
// replica's optimizer over model.parameters() does (Note [Consolidated optimizer state]): each
// flat parameter knows its model index (indices()) and the model's parameter count
// (model_param_count()), so no code assumes that flat buffers, concatenated, are the model. A
// frozen parameter may be of any dtype; a trainable one must be fp32.

// A parameter as a flat buffer lays it out: its state-dict name, the tensor and its position in
// the model's parameters(), frozen parameters counted.
struct IndexedParameter {
  std::string name;
  torch::Tensor tensor;
  int64_t index = 0;
};

// `module`'s parameters that require grad, in named_parameters() order, each with its model index
// (Note [Frozen parameters]).
std::vector<IndexedParameter> trainable_parameters(const torch::nn::Module& module);
// Bytes of `module`'s frozen parameters: every rank holds them whole.
int64_t frozen_parameter_bytes(const torch::nn::Module& module);

class FlatParameters {
 public:
  // Moves `module`'s trainable parameters (fp32) into the flat buffer, keeping their values; the
  // Parameter objects stay the same (their data is replaced), so the module, its submodules and
  // autograd keep working on them. Frozen parameters stay as they are (Note [Frozen parameters]).
  FlatParameters(torch::nn::Module& module, int64_t world_size, int64_t rank);
  // The same over some of a model's trainable parameters, in the order to lay them out, of a
  // model with `model_param_count` parameters: FSDP flattens each unit's on its own (Note [FSDP
  // units]).
  FlatParameters(const std::vector<IndexedParameter>& params, int64_t model_param_count, int64_t world_size,
                 int64_t rank);

  int64_t numel() const { return numel_; }                // the flattened parameters' elements, Psi
  int64_t padded_numel() const { return shard_numel_ * world_size_; }
  int64_t shard_numel() const { return shard_numel_; }    // S
  int64_t shard_begin(int64_t rank) const { return rank * shard_numel_; }
  int64_t world_size() const { return world_size_; }
  int64_t rank() const { return rank_; }

  // (N*S) fp32, the parameters' storage.
  const torch::Tensor& flat() const { return flat_; }
  // (S), this rank's range of flat(), sharing its memory: what the optimizer steps.
  const torch::Tensor& shard() const { return shard_; }

  const std::vector<torch::Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  // Each parameter's position in the model's parameters(), and how many the model has (frozen
  // ones included): the numbering of saved optimizer state (Note [Frozen parameters]).
  const std::vector<int64_t>& indices() const { return indices_; }
  int64_t model_param_count() const { return model_param_count_; }
  // Element offset of each parameter in flat().
  const std::vector<int64_t>& offsets() const { return offsets_; }

  // For the range [begin, end) of flat(): how many of its elements fall in each rank's shard
  // (size N, summing to end - begin), the counts of dist::ProcessGroup::reduce_scatter.
  std::vector<int64_t> shard_counts(int64_t begin, int64_t end) const;

  // A padded flat tensor (N*S, any dtype) as per-parameter tensors shaped like the parameters
  // (copies, contiguous), and back. flatten() checks every shape and names the parameter.
  std::vector<torch::Tensor> unflatten(const torch::Tensor& full) const;
  torch::Tensor flatten(const std::vector<torch::Tensor>& per_param, const std::string& what) const;

 private:
  int64_t world_size_;
  int64_t rank_;
  int64_t numel_ = 0;
  int64_t shard_numel_ = 0;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<int64_t> indices_;
  int64_t model_param_count_ = 0;
  std::vector<int64_t> offsets_;
  torch::Tensor flat_;
  torch::Tensor shard_;
};

}  // namespace lockstep::parallel
