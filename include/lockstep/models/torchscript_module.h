#pragma once
// A model defined in Python and saved as TorchScript (torch.jit.save), trained in C++.

#include <ATen/core/Dict.h>
#include <c10/util/Optional.h>
#include <torch/nn/pimpl.h>
#include <torch/script.h>

#include <string>
#include <vector>

#include "lockstep/models/classifier.h"

namespace lockstep::models {

// Note [TorchScript modules as nn::Modules]
// Strategies, optimizers, checkpoints and state dicts work on torch::nn::Module. This wraps a
// torch::jit::Module as one: every parameter and buffer of the script is registered here under its
// Python name (child modules mirrored, so the state dict reads "blocks.0.fc1.weight" as Python's
// does), and they are the same tensors, so an optimizer step, a broadcast through parameters(), a
// dtype conversion or a flat buffer's set_data is the script's. A parameter frozen in Python
// (requires_grad=False) stays frozen. forward() runs the script's forward on one tensor, and
// train()/eval() switch the script's mode too (dropout, BatchNorm).
//
// Note [Blocks of a TorchScript module]
// fsdp's units, pipeline stages and activation checkpointing need the forward as a chain of blocks
// (Note [Model blocks]). A script's forward is a graph, and it is a chain when it does nothing but
// call its children's forward one after another, each on the previous one's output: a Sequential,
// or a module whose forward is `self.head(self.blocks(self.embed(x)))` or loops over a ModuleList
// (TorchScript unrolls the loop). A child that is itself such a chain (a Sequential inside) is
// opened in turn, so `blocks.0`, `blocks.1` become blocks of their own; anything else (a residual
// block, a Linear) is one block. A block without parameters (ReLU, Flatten, Dropout) joins the
// block before it, so that every unit and stage has weights. Any other operation in a chain's
// forward (`torch.flatten(x, 1)`, a residual sum, a second input) means the children are not the
// whole computation: blocks() refuses, naming the operation and its source line, and the fix is
// to make it a module (torch.nn.Flatten) or keep the strategy that needs no blocks.
class TorchScriptModuleImpl : public Classifier {
 public:
  // Loads `file`; throws c10::Error naming it when it is not a TorchScript module whose forward
  // takes one tensor (check_input refuses one without parameters).
  explicit TorchScriptModuleImpl(const std::string& file);

  // input (B, ...) -> the script's output (B, ...): its own forward, or block by block through
  // the block runner when one is set (see Note [Blocks of a TorchScript module]).
  torch::Tensor forward(torch::Tensor input) override;
  // See Note [Blocks of a TorchScript module]; throws c10::ValueError naming the file and what
  // breaks the chain.
  std::vector<Block> blocks() override;
  void train(bool on = true) override;

  torch::jit::Module& script() { return script_; }

  // Runs `batch` (B, ...) through the model once, in eval mode and without autograd, and checks
  // that it gives (B, K) logits with K >= num_classes. Throws c10::ValueError naming the file,
  // `data` (where the batch came from), its shape and what the module expects, as far as the file
  // says (its first parameter's shape).
  void check_input(const torch::Tensor& batch, int64_t num_classes, const std::string& data);

 private:
  torch::jit::Module script_;
  std::string file_;
  c10::optional<std::vector<Block>> blocks_;  // built on first use
};
TORCH_MODULE(TorchScriptModule);

// torch::jit::load(file) with a forward method, or a c10::Error naming the file and the fix.
torch::jit::Module load_torchscript(const std::string& file);

// What went wrong when a script ran, for an error message of one's own: a c10::Error's message
// without its C++ backtrace; the TorchScript interpreter's error (the script's traceback, then the
// error itself, "RuntimeError: ...") as its last line.
std::string script_error_message(const std::exception& e);

// Writes the TorchScript module of `source` (a file torch.jit.save wrote) with its parameters and
// buffers replaced by `weights` (a state dict with the same keys, e.g. Strategy::model_state_dict
// after training) to `out`, atomically: Python's torch.jit.load(out) then computes what the
// trained model computes. Throws c10::Error naming a missing or misshapen key; nothing is written
// then.
void save_torchscript(const std::string& source, const c10::Dict<std::string, torch::Tensor>& weights,
                      const std::string& out);

}  // namespace lockstep::models
