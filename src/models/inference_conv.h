#pragma once

#include <torch/nn.h>

#include <memory>
#include <mutex>
#include <vector>

namespace lockstep::models {

// A Conv2d and the eval-mode BatchNorm2d after it, run as one convolution with the BatchNorm folded
// into its weights and bias: see Note [Convolutions for inference].
// One object serves one (convolution, BatchNorm) pair for the module's life; it may be called from
// several threads at once.
class InferenceConv {
 public:
  // Whether forward() can run this pair on `x`: fp32 on the CPU, a plain zero-padded convolution
  // (numeric padding, one group) and a BatchNorm2d with running statistics.
  static bool supports(const torch::nn::Conv2dImpl& conv, const torch::nn::BatchNorm2dImpl& norm,
                       const torch::Tensor& x);
  // norm(conv(x)) as LibTorch's eval mode computes it, within float rounding: x (N, C, H, W) fp32
  // -> (N, out_channels, H', W') fp32 channels-last. Call without autograd (no gradient flows).
  torch::Tensor forward(const torch::nn::Conv2dImpl& conv, const torch::nn::BatchNorm2dImpl& norm,
                        const torch::Tensor& x);

  InferenceConv();
  ~InferenceConv();

 private:
  struct Folded;  // the BatchNorm folded into the convolution's weights and bias
  std::shared_ptr<const Folded> folded_for(const torch::nn::Conv2dImpl& conv, const torch::nn::BatchNorm2dImpl& norm);

  std::mutex mutex_;
  std::shared_ptr<const Folded> folded_;  // from the module's tensors as they were at the last call
};

}  // namespace lockstep::models
