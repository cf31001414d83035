#include "norm_relu_pool.h"

#include "norm_relu_pool_kernels.h"

#include <torch/torch.h>

#include <cmath>
#include <typeinfo>
#include <vector>

namespace lockstep::models {
namespace {

// Note [BatchNorm, ReLU and the max-pool as one function in training]
// A convnet block's BatchNorm2d, ReLU and MaxPool2d(2) in train mode are, in LibTorch, five passes
// over the convolution's output forward (statistics, normalisation, ReLU, and the max-pool's layout
// copies and pool) and four backward (the pool's zero fill and scatter, ReLU's mask, BatchNorm's
// reductions and its gradient), each with a full-size temporary: on one thread they took as long as
// the block's convolutions (docs/benchmarks.md, "One function for BatchNorm, ReLU and the max-pool in
// training"). Here forward is two passes, backward one and a quarter:
// - forward: the batch statistics (one pass, sums shifted by the channel's first value so the
//   variance does not cancel), then one pass that normalises each 2x2 window, takes its maximum and
//   its ReLU, and writes only the pooled quarter, the winner's input value and a byte per output
//   naming the window's winner (0-3, row-major), or 4 where ReLU zeroed it (the maximum <= 0: no
//   gradient reaches the window).
// - backward: the gradient reaches BatchNorm's output only at winners, so its two sums (of g and of
//   g * x_hat: the weight's and bias's gradients) run over the saved quarter; then one pass writes the
//   input's gradient, gamma * invstd * (g - mean(g) - x_hat * mean(g * x_hat)), the first term at the
//   winners only.
// The values are LibTorch's within float rounding: its max-pool's first-maximum rule (a NaN wins,
// as a later larger value does), ReLU's NaN passing through, the running statistics updated in
// double with the unbiased variance, momentum or the cumulative average as BatchNorm2d's forward
// picks. Under autocast the convolution's output is bf16: computed in fp32, the normalised values
// rounded to bf16 before the compare, as LibTorch's BatchNorm writes them (so ties fall the same
// way), the input's gradient rounded to bf16, the parameters' in fp32. What this does not cover
// (eval mode, another dtype or layout, odd sizes, a CPU without AVX2) runs LibTorch's modules, and
// a subclass of BatchNorm2d (SyncBatchNorm) its own forward.

namespace kernels = norm_relu_pool_kernels;

// One channel's batch mean and biased variance, in double, from the planes' sums shifted by the
// channel's first value.
struct ChannelStats {
  double mean, var;
};

template <typename T>
std::vector<ChannelStats> batch_stats(const torch::Tensor& x) {  // x (N, C, H, W) contiguous
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  const T* p = x.data_ptr<T>();
  std::vector<ChannelStats> stats(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    const float shift = float(p[ch * hw]);
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < n; ++i) kernels::shifted_sums(p + (i * c + ch) * hw, hw, shift, s1, s2);
    const double m = double(n * hw), d = s1 / m;
    stats[ch] = {shift + d, std::max(0.0, s2 / m - d * d)};
  }
  return stats;
}

// A BatchNorm's weight or bias (C) fp32 as doubles, or c copies of `otherwise` if it has none
// (given as an empty tensor: autograd's Function takes no undefined inputs).
std::vector<double> values_or(const torch::Tensor& t, int64_t c, double otherwise) {
  if (t.numel() == 0) return std::vector<double>(c, otherwise);
  const torch::Tensor v = t.contiguous();
  return std::vector<double>(v.data_ptr<float>(), v.data_ptr<float>() + c);
}

// The forward's planes: out (N, C, H/2, W/2) as x, winner fp32 and code uint8 alike.
template <typename T>
void pool_planes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                 const torch::Tensor& stats, torch::Tensor& out, torch::Tensor& winner, torch::Tensor& code) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3), hw = h * w, ohw = (h / 2) * (w / 2);
  const double* mean = stats.data_ptr<double>();
  const double* invstd = mean + c;
  const std::vector<double> gamma = values_or(weight, c, 1.0), beta = values_or(bias, c, 0.0);
  for (int64_t ch = 0; ch < c; ++ch) {
    const float a = float(gamma[ch] * invstd[ch]), b = float(beta[ch] - mean[ch] * gamma[ch] * invstd[ch]);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t plane = i * c + ch;
      kernels::pool_plane(x.data_ptr<T>() + plane * hw, h, w, a, b, out.data_ptr<T>() + plane * ohw,
                          winner.data_ptr<float>() + plane * ohw, code.data_ptr<uint8_t>() + plane * ohw);
    }
  }
}

// The backward's planes: per channel the sums of g and of g * x_hat over the winners (C), then, if
// gx is defined, the input's gradient into it.
template <typename T>
void grad_planes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& stats,
                 const torch::Tensor& g, const torch::Tensor& winner, const torch::Tensor& code, torch::Tensor& gx,
                 std::vector<double>& sum_g, std::vector<double>& sum_gx) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3), hw = h * w, ohw = (h / 2) * (w / 2);
  const double* mean = stats.data_ptr<double>();
  const double* invstd = mean + c;
  const T* px = x.data_ptr<T>();
  const T* pg = g.data_ptr<T>();
  const uint8_t* pc = code.data_ptr<uint8_t>();
  const float* pw = winner.data_ptr<float>();
  sum_g.assign(c, 0.0), sum_gx.assign(c, 0.0);
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t plane = i * c + ch;
      kernels::winner_sums(pw + plane * ohw, pg + plane * ohw, pc + plane * ohw, ohw, float(mean[ch]), sum_g[ch],
                           sum_gx[ch]);
    }
    sum_gx[ch] *= invstd[ch];
  }
  if (!gx.defined()) return;
  const double count = double(n * hw);
  const std::vector<double> gamma = values_or(weight, c, 1.0);
  for (int64_t ch = 0; ch < c; ++ch) {
    const double k = gamma[ch] * invstd[ch];
    const float a = float(-k * invstd[ch] * sum_gx[ch] / count), b = float(-k * sum_g[ch] / count);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t plane = i * c + ch;
      kernels::grad_plane(px + plane * hw, h, w, float(mean[ch]), a, b, pg + plane * ohw, pc + plane * ohw, float(k),
                          gx.data_ptr<T>() + plane * hw);
    }
  }
}

struct NormReluPool : torch::autograd::Function<NormReluPool> {
  // x (N, C, H, W); weight, bias (C) or empty; stats (2, C) double: batch mean, invstd.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& stats) {
    const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
    torch::Tensor out = torch::empty({n, c, h / 2, w / 2}, x.options());
    torch::Tensor winner = torch::empty(out.sizes(), x.options().dtype(torch::kFloat));
    torch::Tensor code = torch::empty({n, c, h / 2, w / 2}, x.options().dtype(torch::kUInt8));
    if (x.scalar_type() == torch::kBFloat16)
      pool_planes<c10::BFloat16>(x, weight, bias, stats, out, winner, code);
    else
      pool_planes<float>(x, weight, bias, stats, out, winner, code);
    ctx->save_for_backward({x, weight});
    ctx->saved_data["winner"] = winner;
    ctx->saved_data["code"] = code;
    ctx->saved_data["stats"] = stats;
    ctx->saved_data["has_bias"] = bias.numel() > 0;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor winner = ctx->saved_data["winner"].toTensor();
    const torch::Tensor code = ctx->saved_data["code"].toTensor();
    const torch::Tensor stats = ctx->saved_data["stats"].toTensor();
    const torch::Tensor g = grads[0].to(x.scalar_type()).contiguous();
    std::vector<double> sum_g, sum_gx;  // (C)
    torch::Tensor gx = ctx->needs_input_grad(0) ? torch::empty_like(x) : torch::Tensor();
    if (x.scalar_type() == torch::kBFloat16)
      grad_planes<c10::BFloat16>(x, weight, stats, g, winner, code, gx, sum_g, sum_gx);
    else
      grad_planes<float>(x, weight, stats, g, winner, code, gx, sum_g, sum_gx);
    torch::Tensor gw, gb;
    const auto as_tensor = [&](const std::vector<double>& v) {
      return torch::tensor(v, torch::kDouble).to(torch::kFloat);
    };
    if (weight.numel() > 0 && ctx->needs_input_grad(1)) gw = as_tensor(sum_gx);
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) gb = as_tensor(sum_g);
    return {gx, gw, gb, torch::Tensor()};
  }
};

}  // namespace

bool norm_relu_pool_trains(const torch::nn::BatchNorm2dImpl& norm, const torch::Tensor& x) {
  // A subclass (lockstep's SyncBatchNorm, a user's) has a forward of its own.
  return typeid(norm) == typeid(torch::nn::BatchNorm2dImpl) && kernels::avx2_available() && norm.is_training() &&
         x.device().is_cpu() &&
         (x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16) && x.dim() == 4 &&
         x.is_contiguous() && x.size(2) % 2 == 0 && x.size(3) % 2 == 0 && x.size(0) * x.size(2) * x.size(3) > 1 &&
         x.size(1) == norm.options.num_features() &&
         (!norm.weight.defined() || norm.weight.scalar_type() == torch::kFloat) &&
         (!norm.bias.defined() || norm.bias.scalar_type() == torch::kFloat) &&
         (!norm.running_mean.defined() || (norm.running_mean.scalar_type() == torch::kFloat &&
                                           norm.running_var.scalar_type() == torch::kFloat &&
                                           norm.running_mean.is_contiguous() && norm.running_var.is_contiguous()));
}

torch::Tensor norm_relu_pool_train(torch::nn::BatchNorm2dImpl& norm, const torch::Tensor& x) {
  const int64_t c = x.size(1);
  const double count = double(x.size(0) * x.size(2) * x.size(3));
  const std::vector<ChannelStats> batch =
      x.scalar_type() == torch::kBFloat16 ? batch_stats<c10::BFloat16>(x) : batch_stats<float>(x);

  // Running statistics and momentum as BatchNorm2d's forward does (batchnorm.h).
  if (norm.options.track_running_stats() && norm.running_mean.defined()) {
    torch::NoGradGuard no_grad;
    double factor = norm.options.momentum().value_or(0.0);
    if (norm.num_batches_tracked.defined()) {
      norm.num_batches_tracked += 1;
      if (!norm.options.momentum()) factor = 1.0 / norm.num_batches_tracked.item<double>();
    }
    auto mean = norm.running_mean.accessor<float, 1>();
    auto var = norm.running_var.accessor<float, 1>();
    for (int64_t ch = 0; ch < c; ++ch) {
      mean[ch] = float(factor * batch[ch].mean + (1 - factor) * mean[ch]);
      var[ch] = float(factor * batch[ch].var * count / (count - 1) + (1 - factor) * var[ch]);
    }
  }
  torch::Tensor stats = torch::empty({2, c}, torch::kDouble);
  double* s = stats.data_ptr<double>();
  for (int64_t ch = 0; ch < c; ++ch) {
    s[ch] = batch[ch].mean;
    s[c + ch] = 1.0 / std::sqrt(batch[ch].var + norm.options.eps());
  }
  const auto or_empty = [](const torch::Tensor& t) { return t.defined() ? t : torch::empty({0}); };
  return NormReluPool::apply(x, or_empty(norm.weight), or_empty(norm.bias), stats);
}

}  // namespace lockstep::models
