#pragma once

#include <torch/nn.h>

#include "lockstep/models/classifier.h"
#include "lockstep/models/norm_layer.h"

namespace lockstep::models {

// torchvision's BasicBlock: two 3x3 convolutions with batch norm, plus a 1x1 projection
// (`downsample`) when the stride or the width changes. Norm layers come from `norm_layer` (see
// Note [Norm layer factory]).
class BasicBlockImpl : public torch::nn::Module {
 public:
  BasicBlockImpl(int64_t in_planes, int64_t planes, int64_t stride, const NormLayer& norm_layer = batch_norm_2d);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::AnyModule bn1, bn2;  // norm_layer(planes)
  torch::nn::Sequential downsample{nullptr};  // registered only when needed
};
TORCH_MODULE(BasicBlock);

// CIFAR-style ResNet-18 for 3x32x32 inputs: torchvision's resnet18 with a 3x3 stride-1 stem and no
// max pool, so the four stages see 32, 16, 8 and 4 pixels. Keys follow torchvision: conv1.weight,
// bn1.running_mean, layer1.0.conv1.weight, layer2.0.downsample.0.weight, fc.weight, ...
class ResNet18Impl : public Classifier {
 public:
  explicit ResNet18Impl(int64_t num_classes = 10, const NormLayer& norm_layer = batch_norm_2d);
  // stem (conv1, bn1, ReLU), layer1.0 ... layer4.1, fc (pool, flatten, fc); see Note [Model blocks].
  std::vector<Block> blocks() override;

  torch::nn::Conv2d conv1{nullptr};
  torch::nn::AnyModule bn1;  // norm_layer(64)
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet18);

}  // namespace lockstep::models
