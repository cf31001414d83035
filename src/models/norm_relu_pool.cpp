#include "norm_relu_pool.h"

#include "lockstep/models/norm_layer.h"
#include "../core/cpu_isa.h"
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
// - forward: the batch statistics (one pass, fp64 sums shifted by the channel's first value), then
//   one pass that normalises each 2x2 window, takes its maximum and its ReLU, and writes only the
//   pooled quarter, the winner's input value and a byte per output naming the window's winner
//   (0-3, row-major), or 4 where ReLU zeroed it (the maximum <= 0: no gradient reaches the window).
// - backward: the gradient reaches BatchNorm's output only at winners, so its two sums (of g and of
//   g * x_hat: the weight's and bias's gradients) run over the saved quarter; then one pass writes the
//   input's gradient, gamma * invstd * (g - mean(g) - x_hat * mean(g * x_hat)), the first term at the
//   winners only.
// The values are LibTorch's within float rounding: its max-pool's first-maximum rule (a NaN wins,
// as a later larger value does), ReLU's NaN passing through, the running statistics updated in
// double with the unbiased variance, momentum or the cumulative average as BatchNorm2d's forward
// picks. Under autocast the convolution's output is bf16: computed in fp32, the normalised values
// rounded to bf16 before the compare, as LibTorch's BatchNorm writes them (so ties fall the same
// way), the input's gradient rounded to bf16, the parameters' in fp32. A SyncBatchNorm (found
// through models::SumsOverRanks) gets its own sums, unshifted, summed over the ranks where its
// forward and backward all-reduce them (see Note [SyncBatchNorm]); the weight's and bias's
// gradients stay this rank's, as its own. What this does not cover (eval mode, another dtype or
// layout, odd sizes, a CPU without AVX2) runs LibTorch's modules, and another subclass of
// BatchNorm2d its own forward.

namespace kernels = norm_relu_pool_kernels;

// The batch's (2C+1) sums, fp64: count, then per channel the sum and the sum of squares of
// x - shift[c]. x (N, C, H, W) contiguous.
template <typename T>
torch::Tensor batch_sums(const torch::Tensor& x, const std::vector<float>& shift) {
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  const T* p = x.data_ptr<T>();
  torch::Tensor sums = torch::zeros({2 * c + 1}, torch::kDouble);
  double* s = sums.data_ptr<double>();
  s[0] = double(n * hw);
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t i = 0; i < n; ++i)
      kernels::shifted_sums(p + (i * c + ch) * hw, hw, shift[ch], s[1 + ch], s[1 + c + ch]);
  return sums;
}

// Per channel the sum of g and of g * x_hat over the winners: (2C) fp64, as SyncBatchNorm's
// backward packs them.
template <typename T>
torch::Tensor channel_winner_sums(const torch::Tensor& stats, const torch::Tensor& g, const torch::Tensor& winner,
                                  const torch::Tensor& code) {
  const int64_t n = g.size(0), c = g.size(1), ohw = g.size(2) * g.size(3);
  const double* mean = stats.data_ptr<double>();
  const double* invstd = mean + c;
  torch::Tensor sums = torch::zeros({2 * c}, torch::kDouble);
  double* sum_g = sums.data_ptr<double>();
  double* sum_gx = sum_g + c;
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = (i * c + ch) * ohw;
      kernels::winner_sums(winner.data_ptr<float>() + at, g.data_ptr<T>() + at, code.data_ptr<uint8_t>() + at, ohw,
                           float(mean[ch]), sum_g[ch], sum_gx[ch]);
    }
    sum_gx[ch] *= invstd[ch];
  }
  return sums;
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

// The input's gradient into gx, given the (2C) sums of the whole batch (of every rank's, under
// SyncBatchNorm) and its count of values per channel.
template <typename T>
void input_grad_planes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& stats,
                       const torch::Tensor& g, const torch::Tensor& code, const torch::Tensor& sums, double count,
                       torch::Tensor& gx) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3), hw = h * w, ohw = (h / 2) * (w / 2);
  const double* mean = stats.data_ptr<double>();
  const double* invstd = mean + c;
  const double* sum_g = sums.data_ptr<double>();
  const double* sum_gx = sum_g + c;
  const std::vector<double> gamma = values_or(weight, c, 1.0);
  for (int64_t ch = 0; ch < c; ++ch) {
    const double k = gamma[ch] * invstd[ch];
    const float a = float(-k * invstd[ch] * sum_gx[ch] / count), b = float(-k * sum_g[ch] / count);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t plane = i * c + ch;
      kernels::grad_plane(x.data_ptr<T>() + plane * hw, h, w, float(mean[ch]), a, b, g.data_ptr<T>() + plane * ohw,
                          code.data_ptr<uint8_t>() + plane * ohw, float(k), gx.data_ptr<T>() + plane * hw);
    }
  }
}

struct NormReluPool : torch::autograd::Function<NormReluPool> {
  // x (N, C, H, W); weight, bias (C) or empty; stats (2, C) double: batch mean, invstd; count:
  // values per channel in the batch (every rank's under SyncBatchNorm); ranks: SyncBatchNorm's
  // sums, or nullptr.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& stats,
                               double count, const SumsOverRanks* ranks) {
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
    ctx->saved_data["count"] = count;
    ctx->saved_data["ranks"] = reinterpret_cast<int64_t>(ranks);
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
    const bool bf16 = x.scalar_type() == torch::kBFloat16;
    // This rank's sums: the weight's and bias's gradients (DDP averages them over the ranks).
    const torch::Tensor local = bf16 ? channel_winner_sums<c10::BFloat16>(stats, g, winner, code)
                                     : channel_winner_sums<float>(stats, g, winner, code);
    torch::Tensor gx, gw, gb;
    if (ctx->needs_input_grad(0)) {
      torch::Tensor global = local.clone();
      if (const auto* ranks = reinterpret_cast<const SumsOverRanks*>(ctx->saved_data["ranks"].toInt()))
        ranks->sum_over_ranks(global);
      gx = torch::empty_like(x);
      const double count = ctx->saved_data["count"].toDouble();
      if (bf16)
        input_grad_planes<c10::BFloat16>(x, weight, stats, g, code, global, count, gx);
      else
        input_grad_planes<float>(x, weight, stats, g, code, global, count, gx);
    }
    const int64_t c = x.size(1);
    if (weight.numel() > 0 && ctx->needs_input_grad(1)) gw = local.narrow(0, c, c).to(torch::kFloat);
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) gb = local.narrow(0, 0, c).to(torch::kFloat);
    return {gx, gw, gb, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool norm_relu_pool_trains(const torch::nn::BatchNorm2dImpl& norm, const torch::Tensor& x) {
  // A subclass has a forward of its own, unless it is SyncBatchNorm, whose sums this computes. The
  // batch (every rank's) must hold more than one value per channel: checked here for one process,
  // after the sums for several.
  const bool summed = dynamic_cast<const SumsOverRanks*>(&norm) != nullptr;
  if (!summed && typeid(norm) != typeid(torch::nn::BatchNorm2dImpl)) return false;
  return cpu_has_avx2_fma() && norm.is_training() && x.device().is_cpu() &&
         (x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16) && x.dim() == 4 &&
         x.is_contiguous() && x.size(2) % 2 == 0 && x.size(3) % 2 == 0 && x.size(2) > 0 && x.size(3) > 0 &&
         (summed || x.size(0) * x.size(2) * x.size(3) > 1) &&
         x.size(1) == norm.options.num_features() &&
         (!norm.weight.defined() || norm.weight.scalar_type() == torch::kFloat) &&
         (!norm.bias.defined() || norm.bias.scalar_type() == torch::kFloat) &&
         (!norm.running_mean.defined() || (norm.running_mean.scalar_type() == torch::kFloat &&
                                           norm.running_var.scalar_type() == torch::kFloat &&
                                           norm.running_mean.is_contiguous() && norm.running_var.is_contiguous()));
}

torch::Tensor norm_relu_pool_train(torch::nn::BatchNorm2dImpl& norm, const torch::Tensor& x) {
  const int64_t c = x.size(1), hw = x.size(2) * x.size(3);
  const auto* ranks = dynamic_cast<const SumsOverRanks*>(&norm);
  // Sums shifted by each channel's first value, so that E[x^2] - E[x]^2 does not cancel; under
  // SyncBatchNorm unshifted, as its own forward sums them (see Note [SyncBatchNorm]).
  std::vector<float> shift(c, 0.0f);
  if (ranks == nullptr)
    for (int64_t ch = 0; ch < c; ++ch)
      shift[ch] = x.scalar_type() == torch::kBFloat16 ? float(x.data_ptr<c10::BFloat16>()[ch * hw])
                                                      : x.data_ptr<float>()[ch * hw];
  torch::Tensor sums = x.scalar_type() == torch::kBFloat16 ? batch_sums<c10::BFloat16>(x, shift)
                                                           : batch_sums<float>(x, shift);
  if (ranks != nullptr) ranks->sum_over_ranks(sums);
  const double* s = sums.data_ptr<double>();
  const double count = s[0];
  TORCH_CHECK_VALUE(count > 1, "BatchNorm in training on ", ranks ? ranks->rank_description() : "this process",
                    ": the batch has ", count, " value(s) per channel (this process's input ", x.sizes(),
                    "); training needs more than 1: use larger batches, or eval mode");
  struct ChannelStats {
    double mean, var;  // var biased
  };
  std::vector<ChannelStats> batch(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    const double d = s[1 + ch] / count;
    batch[ch] = {shift[ch] + d, std::max(0.0, s[1 + c + ch] / count - d * d)};
  }

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
  double* st = stats.data_ptr<double>();
  for (int64_t ch = 0; ch < c; ++ch) {
    st[ch] = batch[ch].mean;
    st[c + ch] = 1.0 / std::sqrt(batch[ch].var + norm.options.eps());
  }
  const auto or_empty = [](const torch::Tensor& t) { return t.defined() ? t : torch::empty({0}); };
  return NormReluPool::apply(x, or_empty(norm.weight), or_empty(norm.bias), stats, count, ranks);
}

}  // namespace lockstep::models
