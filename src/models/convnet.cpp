#include "lockstep/models/convnet.h"

namespace lockstep::models {
namespace {

torch::nn::Sequential conv_block(int64_t in, int64_t out) {
  namespace nn = torch::nn;
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 5).stride(1).padding(2)),
                        nn::BatchNorm2d(out), nn::ReLU(), nn::MaxPool2d(2));
}

}  // namespace

ConvNetImpl::ConvNetImpl(int64_t num_classes) {
  layer1 = register_module("layer1", conv_block(1, 16));
  layer2 = register_module("layer2", conv_block(16, 32));
  fc = register_module("fc", torch::nn::Linear(7 * 7 * 32, num_classes));
}

torch::Tensor ConvNetImpl::forward(torch::Tensor x) {
  return fc->forward(layer2->forward(layer1->forward(x)).flatten(1));
}

}  // namespace lockstep::models
