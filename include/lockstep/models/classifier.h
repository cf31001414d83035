#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lockstep::models {

// Note [Model blocks]
// A reference model's forward is a chain of blocks, each a function of one tensor: the units that
// activation checkpointing recomputes (parallel::checkpoint_block) and that pipeline stages are cut
// from (parallel::PipelineStrategy). A block names the modules whose parameters and buffers it
// uses, so a stage knows what it trains and a recompute knows what it must not update twice. The
// split follows torchvision and the Python models: ResNet-18's stem (conv1, bn1, ReLU), its eight
// BasicBlocks and its head (pool, flatten, fc); the convnet's layer1, layer2 and fc; the mlp's
// fc1 (with flatten and ReLU) and fc2; mlp-wide's fc1, fc2 (each with its ReLU) and fc3. Blocks
// add no modules: state-dict keys do not change.
struct Block {
  std::string name;                                         // "stem", "layer1.0", "fc", ...
  std::vector<std::shared_ptr<torch::nn::Module>> modules;  // the layers it runs
  std::function<torch::Tensor(const torch::Tensor&)> forward;  // (B, ...) -> (B, ...)
};

// How forward() runs each block: `block.forward(x)` by default; parallel::checkpoint_block
// recomputes it in backward instead of keeping its activations.
using BlockRunner = std::function<torch::Tensor(const Block& block, const torch::Tensor& x)>;

// The common face of the reference models: images in, class logits out. Parameter and buffer
// names equal the state_dict keys of the equivalent Python module (see docs/models.md).
class Classifier : public torch::nn::Module {
 public:
  // x: float (B, C, H, W) -> logits (B, num_classes): the blocks in order, each through the
  // block runner.
  virtual torch::Tensor forward(torch::Tensor x);

  // The forward's blocks, in order (see Note [Model blocks]).
  virtual std::vector<Block> blocks() = 0;

  // Runs every block through `runner` from now on (null: plainly).
  void set_block_runner(BlockRunner runner) { runner_ = std::move(runner); }
  bool has_block_runner() const { return static_cast<bool>(runner_); }
  // One block's forward through the block runner, as forward() runs it.
  torch::Tensor run_block(const Block& block, const torch::Tensor& x) { return runner_ ? runner_(block, x) : block.forward(x); }

 private:
  BlockRunner runner_;
};

// The one check of a classifier's output, shared by training (a TorchScript module's first batch),
// `predict` (every batch) and serving: `logits` must be (B, K) for the B rows of `batch`, with
// K >= min_classes (at least 1), and finite. Throws c10::ValueError naming `model` (its file), the
// shapes, `data` (where the batch came from) and what a classifier returns.
void check_logits(const torch::Tensor& logits, const torch::Tensor& batch, int64_t min_classes,
                  const std::string& model, const std::string& data);

// The parameters and the buffers of the block's modules, each once, in module order.
std::vector<torch::Tensor> block_parameters(const Block& block);
std::vector<torch::Tensor> block_buffers(const Block& block);

}  // namespace lockstep::models
