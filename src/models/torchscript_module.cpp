#include "lockstep/models/torchscript_module.h"

#include <c10/util/Exception.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/types.h>

#include <memory>
#include <sstream>
#include <unordered_map>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/zip_checksum.h"

namespace lockstep::models {
namespace {

// Registers `from`'s own parameters and buffers in `into`, and a mirror of each child.
void mirror(torch::nn::Module& into, const torch::jit::Module& from) {
  for (const auto& p : from.named_parameters(/*recurse=*/false))
    into.register_parameter(p.name, p.value, p.value.requires_grad());
  for (const auto& b : from.named_buffers(/*recurse=*/false)) into.register_buffer(b.name, b.value);
  for (const auto& child : from.named_children()) {
    auto sub = std::make_shared<torch::nn::Module>(child.name);
    mirror(*sub, child.value);
    into.register_module(child.name, sub);
  }
}

std::string join_path(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// "aten::flatten (model.py:21)": a graph node as a Python user finds it in their source.
std::string describe(const torch::jit::Node* node) {
  std::string out = node->kind().toQualString();
  if (node->kind() == c10::prim::CallMethod) out += " '" + node->s(c10::attr::name) + "'";
  // The Python source the node was compiled from (torch.jit.save keeps it), else the archive's code.
  const torch::jit::SourceRange range = node->sourceRange().findSourceRangeThatGenerated().value_or(node->sourceRange());
  if (const auto where = range.file_line_col())
    out += " (" + std::get<0>(*where) + ":" + std::to_string(std::get<1>(*where)) + ")";
  return out;
}

// A child module called by a chain: its dotted path from the top ("blocks.0") and the module.
struct Link {
  std::string path;
  torch::jit::Module module;
};

// The modules `module`'s forward calls one after another, each on the previous one's output (see
// Note [Blocks of a TorchScript module]), appended to `links`; or why the forward is not such a
// chain ("" when it is).
std::string chain_of_calls(const torch::jit::Module& module, const std::string& path, std::vector<Link>& links) {
  const auto graph = module.get_method("forward").graph();
  if (graph->inputs().size() != 2) return "takes " + std::to_string(graph->inputs().size() - 1) + " inputs";
  std::unordered_map<const torch::jit::Value*, Link> held{{graph->inputs()[0], {path, module}}};
  const torch::jit::Value* current = graph->inputs()[1];
  for (const torch::jit::Node* node : graph->nodes()) {
    if (node->kind() == c10::prim::Constant) continue;
    if (node->kind() == c10::prim::GetAttr) {
      const auto owner = held.find(node->input(0));
      const std::string name = node->s(c10::attr::name);
      if (owner == held.end() || !owner->second.module.attr(name).isModule())
        return "reads '" + name + "' itself: " + describe(node);
      held[node->output()] = {join_path(owner->second.path, name), owner->second.module.attr(name).toModule()};
      continue;
    }
    const auto callee = held.find(node->inputs().empty() ? nullptr : node->input(0));
    if (node->kind() != c10::prim::CallMethod || node->s(c10::attr::name) != "forward" || callee == held.end() ||
        node->inputs().size() != 2 || node->input(1) != current)
      return "runs " + describe(node) + " besides calling its children in order";
    links.push_back(callee->second);
    current = node->output();
  }
  if (graph->outputs().size() != 1 || graph->outputs()[0] != current)
    return "returns something other than its last child's output";
  return "";
}

// `link`, or the children it calls in a chain, each opened in turn (a Sequential inside).
void open_chains(const Link& link, std::vector<Link>& out) {
  std::vector<Link> inner;
  if (!link.module.find_method("forward") || !chain_of_calls(link.module, link.path, inner).empty()) {
    out.push_back(link);
    return;
  }
  for (const Link& child : inner) open_chains(child, out);
}

bool has_parameters(const torch::jit::Module& module) { return module.parameters().size() > 0; }

// "; its first parameter 'embed.weight' has shape [32, 16]": what a file says of the input its
// module expects (a saved trace keeps no example shapes).
std::string expected_input(const torch::jit::Module& script) {
  std::ostringstream out;
  for (const auto& p : script.named_parameters()) {
    out << "; its first parameter '" << p.name << "' has shape " << p.value.sizes();
    break;
  }
  return out.str();
}

}  // namespace

torch::jit::Module load_torchscript(const std::string& file) {
  torch::jit::Module module;
  try {
    verify_zip_checksums(read_file(file));  // a flipped bit, or a record that inflates past the file
    module = torch::jit::load(file);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "'", file, "' is not a TorchScript module (torch.jit.save of a scripted or traced module): ",
                e.what_without_backtrace());
  }
  TORCH_CHECK(module.find_method("forward").has_value(), "'", file, "' holds TorchScript without a forward method ",
              "(torch.save of tensors?); save the module itself with torch.jit.save(torch.jit.script(model), ...)");
  return module;
}

std::string script_error_message(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) return error->what_without_backtrace();
  std::string text = e.what();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.substr(text.rfind('\n') + 1);  // npos + 1: from the start
}

TorchScriptModuleImpl::TorchScriptModuleImpl(const std::string& file) : script_(load_torchscript(file)), file_(file) {
  const c10::FunctionSchema& schema = script_.get_method("forward").function().getSchema();
  const auto& args = schema.arguments();
  TORCH_CHECK(args.size() == 2 && args[1].type()->isSubtypeOf(*c10::TensorType::get()), "'", file, "' has ", schema,
              ": a model lockstep trains takes one tensor (the batch) in forward and returns one tensor");
  mirror(*this, script_);
  script_.train(is_training());
}

torch::Tensor TorchScriptModuleImpl::forward(torch::Tensor input) {
  if (has_block_runner()) return Classifier::forward(std::move(input));
  const c10::IValue out = script_.forward({std::move(input)});
  TORCH_CHECK(out.isTensor(), "'", file_, "' returns a ", out.tagKind(), " from forward; a model returns one tensor");
  return out.toTensor();
}

std::vector<Block> TorchScriptModuleImpl::blocks() {
  if (blocks_) return *blocks_;
  std::vector<Link> top, links;
  const std::string why = chain_of_calls(script_, "", top);
  TORCH_CHECK_VALUE(why.empty() && !top.empty(), "'", file_, "': fsdp, pipeline stages and activation checkpointing ",
                    "cut the model into blocks, its children called in order, but its forward ",
                    why.empty() ? "calls no child" : why, ". Make that step a module of its own (e.g. torch.nn.Flatten() ",
                    "in a Sequential), or train with a strategy that needs no blocks (local, dp, ddp, zero1, zero2). ",
                    "See Note [Blocks of a TorchScript module]");
  for (const Link& link : top) open_chains(link, links);
  const auto mirrors = named_modules("", /*include_self=*/false);
  std::vector<Block> blocks;
  std::vector<Link> waiting;  // parameter-less links before the first block with weights
  const auto add = [&](Block& block, const Link& link) {
    block.modules.push_back(mirrors[link.path]);
    auto previous = std::move(block.forward);
    block.forward = [previous, script = link.module](const torch::Tensor& x) mutable {
      return script.forward({previous ? previous(x) : x}).toTensor();
    };
  };
  for (const Link& link : links) {
    if (!has_parameters(link.module)) {
      if (blocks.empty()) {
        waiting.push_back(link);
      } else {
        add(blocks.back(), link);
        blocks.back().name = blocks.back().name.substr(0, blocks.back().name.find("..")) + ".." + link.path;
      }
      continue;
    }
    Block block{link.path, {}, nullptr};
    for (const Link& before : waiting) add(block, before);
    waiting.clear();
    add(block, link);
    blocks.push_back(std::move(block));
  }
  TORCH_CHECK_VALUE(!blocks.empty(), "'", file_, "' has no parameters in the children its forward calls: there is ",
                    "nothing to cut into blocks");
  blocks_ = std::move(blocks);
  return *blocks_;
}

void TorchScriptModuleImpl::train(bool on) {
  torch::nn::Module::train(on);
  script_.train(on);
}

void TorchScriptModuleImpl::check_input(const torch::Tensor& batch, int64_t num_classes, const std::string& data) {
  TORCH_CHECK_VALUE(!parameters().empty(), "'", file_, "' has no parameters: there is nothing to train (it holds ",
                    buffers().size(), " buffers); script the model with its layers as attributes");
  const bool was_training = is_training();
  eval();
  torch::Tensor out;
  std::string failure;
  {
    torch::NoGradGuard no_grad;
    try {
      out = forward(batch);
    } catch (const std::exception& e) {
      failure = script_error_message(e);
    }
  }
  train(was_training);
  TORCH_CHECK_VALUE(failure.empty(), "'", file_, "' cannot take ", data, ": a batch of shape ", batch.sizes(),
                    " fails in its forward with \"", failure, "\"", expected_input(script_));
  check_logits(out, batch, num_classes, "'" + file_ + "'", data + " (" + std::to_string(num_classes) + " classes)");
}

void save_torchscript(const std::string& source, const c10::Dict<std::string, torch::Tensor>& weights,
                      const std::string& out) {
  torch::jit::Module module = load_torchscript(source);
  torch::NoGradGuard no_grad;
  size_t copied = 0;
  const auto copy = [&](const std::string& key, torch::Tensor into) {
    const auto it = weights.find(key);
    TORCH_CHECK(it != weights.end(), "saving '", out, "': the trained weights have no '", key, "', which '", source,
                "' holds; pass the state dict of the model loaded from it");
    TORCH_CHECK(it->value().sizes() == into.sizes(), "saving '", out, "': '", key, "' has shape ", it->value().sizes(),
                " but ", into.sizes(), " in '", source, "'");
    into.copy_(it->value());
    ++copied;
  };
  for (const auto& p : module.named_parameters()) copy(p.name, p.value);
  for (const auto& b : module.named_buffers()) copy(b.name, b.value);
  TORCH_CHECK(copied == weights.size(), "saving '", out, "': the trained weights hold ", weights.size(), " tensors, '",
              source, "' only ", copied, "; pass the state dict of the model loaded from it");
  std::ostringstream bytes;
  module.save(bytes);
  const std::string text = bytes.str();
  write_file_atomic(out, std::vector<char>(text.begin(), text.end()));
}

}  // namespace lockstep::models
