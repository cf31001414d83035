// Emitters for LibTorch's own layers (see Note [Export by module type]). Each maps the module's
// eval-mode forward() onto opset-17 operators and refuses, naming the option, what it cannot map.
#include <torch/torch.h>

#include "lockstep/export/emitter_registry.h"

namespace lockstep::exporting {
namespace {

namespace nn = torch::nn;

template <size_t D>
std::vector<int64_t> ints(const torch::ExpandingArray<D>& a) {
  return std::vector<int64_t>(a->begin(), a->end());
}

// ONNX pads are [begin of each axis..., end of each axis...]; PyTorch pads both ends alike.
template <size_t D>
std::vector<int64_t> symmetric_pads(const torch::ExpandingArray<D>& padding) {
  std::vector<int64_t> pads = ints(padding);
  pads.insert(pads.end(), padding->begin(), padding->end());
  return pads;
}

std::string emit_linear(const nn::LinearImpl& m, Scope& s, const std::string& x) {
  // y = x W^T + b on (B, in) -> (B, out): Gemm with transB.
  std::vector<std::string> inputs{x, s.initializer("weight", m.weight)};
  if (m.bias.defined()) inputs.push_back(s.initializer("bias", m.bias));
  auto& node = s.node("Gemm", inputs);
  set_attribute(node, "transB", int64_t{1});
  return node.output(0);
}

std::string emit_conv2d(const nn::Conv2dImpl& m, Scope& s, const std::string& x) {
  const auto& o = m.options;
  TORCH_CHECK(std::get_if<torch::enumtype::kZeros>(&o.padding_mode()) != nullptr, "cannot export '", s.path(),
              "': Conv2d padding_mode ", torch::enumtype::get_enum_name(o.padding_mode()),
              " has no ONNX Conv equivalent; only zeros padding exports");
  std::vector<std::string> inputs{x, s.initializer("weight", m.weight)};
  if (m.bias.defined()) inputs.push_back(s.initializer("bias", m.bias));
  auto& node = s.node("Conv", inputs);
  set_attribute(node, "kernel_shape", ints(o.kernel_size()));
  set_attribute(node, "strides", ints(o.stride()));
  set_attribute(node, "dilations", ints(o.dilation()));
  set_attribute(node, "group", o.groups());
  if (const auto* explicit_pads = std::get_if<torch::ExpandingArray<2>>(&o.padding())) {
    set_attribute(node, "pads", symmetric_pads(*explicit_pads));
  } else if (std::get_if<torch::enumtype::kSame>(&o.padding()) != nullptr) {
    // PyTorch's 'same' puts the odd pixel of padding at the end, as SAME_UPPER does.
    auto* a = node.add_attribute();
    a->set_name("auto_pad");
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s("SAME_UPPER");
  }  // 'valid': no padding, ONNX's default
  return node.output(0);
}

std::string emit_batch_norm(const nn::BatchNorm2dImpl& m, Scope& s, const std::string& x) {
  const auto& o = m.options;
  TORCH_CHECK(o.track_running_stats(), "cannot export '", s.path(),
              "': BatchNorm2d without running statistics normalises by each batch's own statistics even "
              "in eval mode, which ONNX's inference BatchNormalization cannot express");
  const int64_t c = o.num_features();
  const torch::Tensor scale = o.affine() ? m.weight : torch::ones({c});
  const torch::Tensor shift = o.affine() ? m.bias : torch::zeros({c});
  auto& node = s.node("BatchNormalization", {x, s.initializer(o.affine() ? "weight" : "scale", scale),
                                             s.initializer(o.affine() ? "bias" : "shift", shift),
                                             s.initializer("running_mean", m.running_mean),
                                             s.initializer("running_var", m.running_var)});
  set_attribute(node, "epsilon", static_cast<float>(o.eps()));
  return node.output(0);
}

std::string emit_max_pool(const nn::MaxPool2dImpl& m, Scope& s, const std::string& x) {
  const auto& o = m.options;
  auto& node = s.node("MaxPool", {x});
  set_attribute(node, "kernel_shape", ints(o.kernel_size()));
  set_attribute(node, "strides", ints(o.stride()));
  set_attribute(node, "pads", symmetric_pads(o.padding()));
  set_attribute(node, "dilations", ints(o.dilation()));
  set_attribute(node, "ceil_mode", int64_t{o.ceil_mode() ? 1 : 0});
  return node.output(0);
}

std::string emit_avg_pool(const nn::AvgPool2dImpl& m, Scope& s, const std::string& x) {
  const auto& o = m.options;
  TORCH_CHECK(!o.divisor_override().has_value(), "cannot export '", s.path(),
              "': AvgPool2d divisor_override has no ONNX AveragePool equivalent");
  auto& node = s.node("AveragePool", {x});
  set_attribute(node, "kernel_shape", ints(o.kernel_size()));
  set_attribute(node, "strides", ints(o.stride()));
  set_attribute(node, "pads", symmetric_pads(o.padding()));
  set_attribute(node, "ceil_mode", int64_t{o.ceil_mode() ? 1 : 0});
  set_attribute(node, "count_include_pad", int64_t{o.count_include_pad() ? 1 : 0});
  return node.output(0);
}

std::string emit_adaptive_avg_pool(const nn::AdaptiveAvgPool2dImpl& m, Scope& s, const std::string& x) {
  const auto& size = *m.options.output_size();
  const bool one_by_one = size[0].has_value() && *size[0] == 1 && size[1].has_value() && *size[1] == 1;
  TORCH_CHECK(one_by_one, "cannot export '", s.path(), "': AdaptiveAvgPool2d exports only with output size 1x1 "
              "(ONNX GlobalAveragePool); other sizes depend on the input size");
  return s.op("GlobalAveragePool", {x});
}

std::string emit_flatten(const nn::FlattenImpl& m, Scope& s, const std::string& x) {
  // ONNX Flatten(axis) always yields 2-D (B, rest): equal to torch.flatten(x, 1, -1) only.
  TORCH_CHECK(m.options.start_dim() == 1 && m.options.end_dim() == -1, "cannot export '", s.path(),
              "': Flatten(start_dim=", m.options.start_dim(), ", end_dim=", m.options.end_dim(),
              ") exports only as Flatten(1, -1)");
  auto& node = s.node("Flatten", {x});
  set_attribute(node, "axis", int64_t{1});
  return node.output(0);
}

std::string emit_sequential(const nn::SequentialImpl&, Scope& s, const std::string& x) {
  std::string y = x;
  for (const auto& name : s.child_names()) y = s.child(name, y);
  return y;
}

}  // namespace

void add_layer_emitters(EmitterRegistry& r) {
  r.add<nn::LinearImpl>(emit_linear);
  r.add<nn::Conv2dImpl>(emit_conv2d);
  r.add<nn::BatchNorm2dImpl>(emit_batch_norm);
  r.add<nn::ReLUImpl>([](const nn::ReLUImpl&, Scope& s, const std::string& x) { return s.op("Relu", {x}); });
  r.add<nn::MaxPool2dImpl>(emit_max_pool);
  r.add<nn::AvgPool2dImpl>(emit_avg_pool);
  r.add<nn::AdaptiveAvgPool2dImpl>(emit_adaptive_avg_pool);
  r.add<nn::FlattenImpl>(emit_flatten);
  // Identity in eval mode, which is how the model is exported.
  r.add<nn::DropoutImpl>([](const nn::DropoutImpl&, Scope&, const std::string& x) { return x; });
  r.add<nn::IdentityImpl>([](const nn::IdentityImpl&, Scope&, const std::string& x) { return x; });
  r.add<nn::SequentialImpl>(emit_sequential);
}

}  // namespace lockstep::exporting
