// Emitters for the reference models and their blocks: each mirrors its module's forward() (see
// src/models/) and reaches the children by their state-dict names, so a child's C++ type (a
// BatchNorm2d today, another norm layer tomorrow) is resolved by the registry, not here.
// See Note [Export by module type].
#include <torch/torch.h>

#include "lockstep/export/emitter_registry.h"
#include "lockstep/models/convnet.h"
#include "lockstep/models/mlp.h"
#include "lockstep/models/resnet.h"

namespace lockstep::exporting {
namespace {

// torch.flatten(x, 1): (B, ...) -> (B, rest).
std::string flatten(Scope& s, const std::string& x) {
  auto& node = s.node("Flatten", {x});
  set_attribute(node, "axis", int64_t{1});
  return node.output(0);
}

// MLPImpl::forward: fc2(relu(fc1(flatten(x)))).
std::string emit_mlp(const models::MLPImpl&, Scope& s, const std::string& x) {
  return s.child("fc2", s.op("Relu", {s.child("fc1", flatten(s, x))}));
}

// WideMLPImpl::forward: fc3(relu(fc2(relu(fc1(flatten(x)))))).
std::string emit_wide_mlp(const models::WideMLPImpl&, Scope& s, const std::string& x) {
  return s.child("fc3", s.op("Relu", {s.child("fc2", s.op("Relu", {s.child("fc1", flatten(s, x))}))}));
}

// ConvNetImpl::forward: fc(flatten(layer2(layer1(x)))).
std::string emit_convnet(const models::ConvNetImpl&, Scope& s, const std::string& x) {
  return s.child("fc", flatten(s, s.child("layer2", s.child("layer1", x))));
}

// BasicBlockImpl::forward: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut), the shortcut being
// downsample(x) when the block has one, x otherwise.
std::string emit_basic_block(const models::BasicBlockImpl&, Scope& s, const std::string& x) {
  std::string out = s.op("Relu", {s.child("bn1", s.child("conv1", x))});
  out = s.child("bn2", s.child("conv2", out));
  const auto names = s.child_names();
  const bool projects = std::find(names.begin(), names.end(), "downsample") != names.end();
  const std::string shortcut = projects ? s.child("downsample", x) : x;
  return s.op("Relu", {s.op("Add", {out, shortcut})});
}

// ResNet18Impl::forward: fc(flatten(avgpool_1x1(layer4(...layer1(relu(bn1(conv1(x)))))))).
std::string emit_resnet18(const models::ResNet18Impl&, Scope& s, const std::string& x) {
  std::string y = s.op("Relu", {s.child("bn1", s.child("conv1", x))});
  for (const char* stage : {"layer1", "layer2", "layer3", "layer4"}) y = s.child(stage, y);
  return s.child("fc", flatten(s, s.op("GlobalAveragePool", {y})));
}

// The convnet's MaxPool2d(2) that runs in channels-last layout (src/models/convnet.cpp): the
// layout is an implementation detail of LibTorch's kernels, the values are MaxPool's, so it
// exports as the standard operator. Its type lives in an anonymous namespace: found by name.
std::string emit_channels_last_max_pool(Scope& s, const std::string& x) {
  auto& node = s.node("MaxPool", {x});
  set_attribute(node, "kernel_shape", std::vector<int64_t>{2, 2});
  set_attribute(node, "strides", std::vector<int64_t>{2, 2});
  return node.output(0);
}

}  // namespace

void add_reference_model_emitters(EmitterRegistry& r) {
  r.add<models::MLPImpl>(emit_mlp);
  r.add<models::WideMLPImpl>(emit_wide_mlp);
  r.add<models::ConvNetImpl>(emit_convnet);
  r.add<models::BasicBlockImpl>(emit_basic_block);
  r.add<models::ResNet18Impl>(emit_resnet18);
  r.add("lockstep::models::(anonymous namespace)::ChannelsLastMaxPool2dImpl", emit_channels_last_max_pool);
}

}  // namespace lockstep::exporting
