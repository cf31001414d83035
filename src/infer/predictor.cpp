#include "lockstep/infer/predictor.h"

#include <torch/torch.h>

#include "lockstep/amp/autocast.h"
#include "lockstep/train/evaluate.h"

namespace lockstep::infer {

Predictor::Predictor(torch::nn::AnyModule model, PredictorOptions options)
    : model_(std::move(model)), module_(model_.ptr()), options_(options) {
  TORCH_CHECK_VALUE(options_.batch_size() >= 1, "Predictor batch size ", options_.batch_size(), " must be at least 1");
  if (options_.autocast())
    TORCH_CHECK_VALUE(*options_.autocast() == torch::kBFloat16 || *options_.autocast() == torch::kHalf,
                      "Predictor autocast dtype must be kBFloat16 or kHalf, got ", *options_.autocast());
  module_->eval();
  const auto params = module_->parameters();
  if (options_.channels_last()) {
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& p : params)
      if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
  }
  // Its device is read on every call: Module::to moves a parameter with set_data, which keeps it
  // this tensor. Listing the parameters per call cost ~2 us, 4% of a batch of one.
  if (!params.empty()) first_parameter_ = params.front();
}

// Note [Channels-last weights for inference]
// LibTorch hands a convolution to oneDNN. With NCHW operands oneDNN runs it in a blocked layout
// (ONEDNN_VERBOSE=1 shows nChw16c) and reorders the input and the output on every call; when the
// weights are channels-last, LibTorch runs it in NHWC and those reorders go, which at inference's
// small batches is a large part of a convolution's time (docs/benchmarks.md, "Channels-last weights
// for inference"). Only the memory layout changes, never a value, so a model saved, exported or
// trained afterwards sees the same numbers. The input stays as the caller gives it.

torch::Tensor Predictor::forward(const torch::Tensor& input) {
  torch::NoGradGuard no_grad;
  const torch::Device device = first_parameter_.defined() ? first_parameter_.device() : torch::Device(torch::kCPU);
  amp::AutocastGuard autocast(device.type(), options_.autocast().value_or(torch::kBFloat16),
                              options_.autocast().has_value());
  return model_.forward(input.to(device)).to(torch::kFloat);
}

torch::Tensor Predictor::predict(const torch::Tensor& input) { return forward(input).argmax(1); }

double Predictor::evaluate(const data::Dataset& dataset, dist::ProcessGroup* group) {
  return train::evaluate(*module_, [this](const torch::Tensor& x) { return forward(x); }, dataset, group,
                         options_.batch_size());
}

}  // namespace lockstep::infer
