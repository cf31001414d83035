#include "inference_conv.h"

#include <cstring>

namespace lockstep::models {

// Note [Convolutions for inference]
// A Conv2d followed by an eval-mode BatchNorm2d is one convolution with other weights:
//   w' = w * s and b' = (b - running_mean) * s + beta, with s = gamma / sqrt(running_var + eps)
// (computed in double). The folded weights are made once per value of the module's tensors and
// the pair then runs as a single LibTorch convolution on channels-last data, one pass over the
// activations instead of two. A copy of the six tensors they were folded from is kept and compared
// byte for byte on every call (~50 KB for the convnet's second block, a few microseconds), so any
// change (an optimizer step, a train-mode forward's new running statistics, load_state_dict) folds
// them again on the next call. Values differ from LibTorch's two layers by float rounding only (the
// fold, and the order of the sums), ~1e-7 relative.
// Up to LibTorch 1.13 this file drove Debian's oneDNN 2.6 directly, building a primitive per input
// shape. The torch wheel carries its own oneDNN 3.x inside libtorch_cpu.so, and both export the same
// template instantiations over oneDNN's internal types (std::call_once's trampolines of
// dnnl::impl::cpu::x64::gemm_info_t<...>::jit_init, bound through GLOB_DAT relocations), so loading
// Debian's beside it would let one library run the other's code: lockstep links no oneDNN of its own
// (tests/core/library_symbols_test.cpp).

namespace {

const torch::ExpandingArray<2>* numeric_padding(const torch::nn::Conv2dImpl& conv) {
  return std::get_if<torch::ExpandingArray<2>>(&conv.options.padding());
}

// Output extent of one spatial dimension, as LibTorch's convolution computes it.
int64_t output_extent(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

std::vector<torch::Tensor> sources_of(const torch::nn::Conv2dImpl& conv, const torch::nn::BatchNorm2dImpl& norm) {
  return {conv.weight, conv.bias, norm.weight, norm.bias, norm.running_mean, norm.running_var};
}

}  // namespace

// The BatchNorm folded into the convolution (Note [Convolutions for inference]), in
// LibTorch's OIHW layout, and the six tensors it was folded from.
struct InferenceConv::Folded {
  // A copy of a tensor the folded weights came from, and whether the module's tensor still holds the
  // same bytes. Values, not version counters: BatchNorm's kernel updates its running statistics
  // without bumping theirs, and a write through `.data()` bumps another one.
  struct Source {
    torch::Tensor copy;
    explicit Source(const torch::Tensor& t) : copy(t.defined() ? t.detach().clone() : torch::Tensor()) {}
    bool current(const torch::Tensor& t) const {
      if (!t.defined() || !copy.defined()) return t.defined() == copy.defined();
      return t.scalar_type() == copy.scalar_type() && t.sizes() == copy.sizes() && t.strides() == copy.strides() &&
             t.is_non_overlapping_and_dense() && std::memcmp(t.data_ptr(), copy.data_ptr(), t.nbytes()) == 0;
    }
  };

  std::vector<Source> sources;
  torch::Tensor weights, bias;  // fp32, contiguous

  Folded(const torch::nn::Conv2dImpl& conv, const torch::nn::BatchNorm2dImpl& norm,
         const std::vector<torch::Tensor>& from) {
    for (const torch::Tensor& t : from) sources.emplace_back(t);
    torch::NoGradGuard no_grad;
    const int64_t channels = conv.options.out_channels();
    const auto as_double = [](const torch::Tensor& t) { return t.detach().to(torch::kDouble); };
    const auto ones = torch::ones({channels}, torch::kDouble), zeros = torch::zeros({channels}, torch::kDouble);
    const torch::Tensor gamma = norm.weight.defined() ? as_double(norm.weight) : ones;
    const torch::Tensor beta = norm.bias.defined() ? as_double(norm.bias) : zeros;
    const torch::Tensor conv_bias = conv.bias.defined() ? as_double(conv.bias) : zeros;
    const torch::Tensor scale = gamma / (as_double(norm.running_var) + norm.options.eps()).sqrt();
    weights = (as_double(conv.weight) * scale.view({-1, 1, 1, 1})).to(torch::kFloat).contiguous();
    bias = ((conv_bias - as_double(norm.running_mean)) * scale + beta).to(torch::kFloat).contiguous();
  }
  bool current(const std::vector<torch::Tensor>& now) const {
    for (size_t i = 0; i < now.size(); ++i)
      if (!sources[i].current(now[i])) return false;
    return true;
  }
};

InferenceConv::InferenceConv() = default;
InferenceConv::~InferenceConv() = default;

bool InferenceConv::supports(const torch::nn::Conv2dImpl& conv, const torch::nn::BatchNorm2dImpl& norm,
                             const torch::Tensor& x) {
  const auto& o = conv.options;
  const auto* pad = numeric_padding(conv);
  if (pad == nullptr || o.groups() != 1 || !std::get_if<torch::enumtype::kZeros>(&o.padding_mode())) return false;
  if (!x.device().is_cpu() || x.scalar_type() != torch::kFloat || x.dim() != 4 || x.size(0) == 0 ||
      x.size(1) != o.in_channels() || !conv.weight.device().is_cpu() || conv.weight.scalar_type() != torch::kFloat)
    return false;
  if (!norm.options.track_running_stats() || !norm.running_mean.defined() ||
      norm.running_mean.scalar_type() != torch::kFloat || norm.running_mean.size(0) != o.out_channels())
    return false;
  for (int d = 0; d < 2; ++d)
    if (output_extent(x.size(2 + d), (*o.kernel_size())[d], (*o.stride())[d], (**pad)[d], (*o.dilation())[d]) < 1)
      return false;
  return true;
}

std::shared_ptr<const InferenceConv::Folded> InferenceConv::folded_for(const torch::nn::Conv2dImpl& conv,
                                                                       const torch::nn::BatchNorm2dImpl& norm) {
  const std::vector<torch::Tensor> now = sources_of(conv, norm);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!folded_ || !folded_->current(now)) folded_ = std::make_shared<const Folded>(conv, norm, now);
  return folded_;  // a call still running on the previous one keeps it alive
}

torch::Tensor InferenceConv::forward(const torch::nn::Conv2dImpl& conv, const torch::nn::BatchNorm2dImpl& norm,
                                     const torch::Tensor& x) {
  TORCH_CHECK(supports(conv, norm, x), "InferenceConv: unsupported convolution or input ", x.sizes());
  const std::shared_ptr<const Folded> folded = folded_for(conv, norm);
  const auto& o = conv.options;
  const auto& pad = **numeric_padding(conv);
  const torch::Tensor in = x.contiguous(torch::MemoryFormat::ChannelsLast);
  return torch::conv2d(in, folded->weights, folded->bias, {(*o.stride())[0], (*o.stride())[1]}, {pad[0], pad[1]},
                       {(*o.dilation())[0], (*o.dilation())[1]})
      .contiguous(torch::MemoryFormat::ChannelsLast);
}

}  // namespace lockstep::models
