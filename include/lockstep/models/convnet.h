#pragma once

#include <torch/nn.h>

#include <array>
#include <memory>

#include "lockstep/models/classifier.h"
#include "lockstep/models/norm_layer.h"

namespace lockstep::models {

class InferenceConv;

// The classic two-block CNN for 1x28x28 images:
//   layer1 = Conv2d(1,16,k5,p2), norm_layer(16), ReLU, MaxPool2d(2)     -> (B, 16, 14, 14)
//   (norm_layer: BatchNorm2d unless told otherwise; see Note [Norm layer factory])
//   (for speed, in training a BatchNorm2d, ReLU and the pool run as one function, and in evaluation
//   each block is one oneDNN convolution with the BatchNorm folded in and one pass for ReLU and the
//   pool; see convnet.cpp. Values are those of the modules within float rounding.)
//   layer2 = Conv2d(16,32,k5,p2), norm_layer(32), ReLU, MaxPool2d(2)    -> (B, 32, 7, 7)
//   fc     = Linear(1568, num_classes)
// Keys: layer1.0.weight, layer1.1.running_mean, layer2.0.bias, fc.weight, ...
class ConvNetImpl : public Classifier {
 public:
  explicit ConvNetImpl(int64_t num_classes = 10, const NormLayer& norm_layer = batch_norm_2d);
  // layer1, layer2, fc (flatten and fc); see Note [Model blocks].
  std::vector<Block> blocks() override;

  torch::nn::Sequential layer1{nullptr}, layer2{nullptr};
  torch::nn::Linear fc{nullptr};

 private:
  // Each block's convolution and BatchNorm in evaluation (see convnet.cpp).
  std::array<std::shared_ptr<InferenceConv>, 2> inference_;
};
TORCH_MODULE(ConvNet);

}  // namespace lockstep::models
