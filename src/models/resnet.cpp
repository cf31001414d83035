#include "lockstep/models/resnet.h"

namespace lockstep::models {
namespace nn = torch::nn;
namespace {

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

nn::Sequential stage(int64_t in_planes, int64_t planes, int64_t stride, const NormLayer& norm_layer) {
  return nn::Sequential(BasicBlock(in_planes, planes, stride, norm_layer), BasicBlock(planes, planes, 1, norm_layer));
}

}  // namespace

BasicBlockImpl::BasicBlockImpl(int64_t in_planes, int64_t planes, int64_t stride, const NormLayer& norm_layer) {
  conv1 = register_module("conv1", conv(in_planes, planes, 3, stride));
  bn1 = norm_layer(planes);
  register_module("bn1", bn1.ptr());
  conv2 = register_module("conv2", conv(planes, planes, 3, 1));
  bn2 = norm_layer(planes);
  register_module("bn2", bn2.ptr());
  if (stride != 1 || in_planes != planes) {
    downsample = register_module(
        "downsample", nn::Sequential(conv(in_planes, planes, 1, stride), norm_layer(planes)));
  }
}

torch::Tensor BasicBlockImpl::forward(torch::Tensor x) {
  torch::Tensor out = torch::relu(bn1.forward(conv1->forward(x)));
  out = bn2.forward(conv2->forward(out));
  out += downsample ? downsample->forward(x) : x;
  return torch::relu(out);
}

ResNet18Impl::ResNet18Impl(int64_t num_classes, const NormLayer& norm_layer) {
  conv1 = register_module("conv1", conv(3, 64, 3, 1));
  bn1 = norm_layer(64);
  register_module("bn1", bn1.ptr());
  layer1 = register_module("layer1", stage(64, 64, 1, norm_layer));
  layer2 = register_module("layer2", stage(64, 128, 2, norm_layer));
  layer3 = register_module("layer3", stage(128, 256, 2, norm_layer));
  layer4 = register_module("layer4", stage(256, 512, 2, norm_layer));
  fc = register_module("fc", nn::Linear(512, num_classes));
}

std::vector<Block> ResNet18Impl::blocks() {
  auto stem_conv = conv1.ptr();
  auto stem_norm = bn1;
  std::vector<Block> out{{"stem", {stem_conv, stem_norm.ptr()}, [stem_conv, stem_norm](const torch::Tensor& x) mutable {
                            return torch::relu(stem_norm.forward(stem_conv->forward(x)));
                          }}};
  const std::vector<std::pair<std::string, nn::Sequential>> stages{
      {"layer1", layer1}, {"layer2", layer2}, {"layer3", layer3}, {"layer4", layer4}};
  for (const auto& [name, stage] : stages) {
    for (size_t i = 0; i < stage->size(); ++i) {
      auto block = std::dynamic_pointer_cast<BasicBlockImpl>(stage->ptr(i));
      out.push_back({name + "." + std::to_string(i), {block}, [block](const torch::Tensor& x) { return block->forward(x); }});
    }
  }
  auto head = fc.ptr();
  out.push_back({"fc", {head}, [head](const torch::Tensor& x) {
                   return head->forward(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
                 }});
  return out;
}

}  // namespace lockstep::models
