#include "fused_sgd.h"

#include <immintrin.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "../core/cpu_isa.h"

namespace lockstep::optim {
namespace {

struct Hyper {
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
};

// What follows is compiled for AVX2 and FMA; call it only where cpu_has_avx2_fma() says so.
LOCKSTEP_AVX2_FMA_BEGIN

// The update of eight elements (the first `count` of them read and written), as LibTorch's SGD
// computes it: d = g + wd * p; buf = buf * momentum, then buf + (1 - dampening) * d; nesterov
// d + momentum * buf, else buf; p + (-lr) * that. Each a + s * b is one fused multiply-add, as
// ATen's vectorised add with alpha is.
void sgd_update(float* p, const float* g, float* buf, int64_t n, const Hyper& h) {
  const __m256 lr = _mm256_set1_ps(-h.lr), m = _mm256_set1_ps(h.momentum), keep = _mm256_set1_ps(1.0f - h.dampening);
  const __m256 wd = _mm256_set1_ps(h.weight_decay);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t count = std::min<int64_t>(8, n - i);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), lane);
    const __m256 pv = _mm256_maskload_ps(p + i, mask);
    __m256 d = _mm256_maskload_ps(g + i, mask);
    if (h.weight_decay != 0) d = _mm256_fmadd_ps(pv, wd, d);
    if (h.momentum != 0) {
      const __m256 b = _mm256_fmadd_ps(d, keep, _mm256_mul_ps(_mm256_maskload_ps(buf + i, mask), m));
      _mm256_maskstore_ps(buf + i, mask, b);
      d = h.nesterov ? _mm256_fmadd_ps(b, m, d) : b;
    }
    _mm256_maskstore_ps(p + i, mask, _mm256_fmadd_ps(d, lr, pv));
  }
}

LOCKSTEP_AVX2_FMA_END

bool plain_fp32(const torch::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == torch::kStrided && t.scalar_type() == torch::kFloat &&
         t.is_contiguous();
}

}  // namespace

torch::Tensor FusedSGD::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  const bool simd = cpu_has_avx2_fma();
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    const Hyper h{static_cast<float>(o.lr()), static_cast<float>(o.momentum()), static_cast<float>(o.dampening()),
                  static_cast<float>(o.weight_decay()), o.nesterov()};
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const torch::Tensor& grad = p.grad();
      auto found = state_.find(p.unsafeGetTensorImpl());
      torch::Tensor buf;
      if (found != state_.end()) buf = static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer();
      const bool fused = simd && plain_fp32(p) && plain_fp32(grad) && grad.numel() == p.numel() &&
                         (o.momentum() == 0 || (plain_fp32(buf) && buf.numel() == p.numel()));
      if (fused) {
        sgd_update(p.data_ptr<float>(), grad.data_ptr<float>(), o.momentum() != 0 ? buf.data_ptr<float>() : nullptr,
                   p.numel(), h);
        // Written in place as add_ would: a graph that saved p (or buf) notices, as with LibTorch's.
        torch::autograd::impl::bump_version(p);
        if (o.momentum() != 0) torch::autograd::impl::bump_version(buf);
        continue;
      }
      // LibTorch's operators, in LibTorch's order.
      torch::Tensor d = grad;
      if (o.weight_decay() != 0) d = d.add(p, o.weight_decay());
      if (o.momentum() != 0) {
        if (!buf.defined()) {
          buf = torch::clone(d).detach();
          auto state = std::make_unique<torch::optim::SGDParamState>();
          state->momentum_buffer(buf);
          state_[p.unsafeGetTensorImpl()] = std::move(state);
        } else {
          buf.mul_(o.momentum()).add_(d, 1 - o.dampening());
        }
        d = o.nesterov() ? d.add(buf, o.momentum()) : buf;
      }
      p.add_(d, -o.lr());
    }
  }
  return loss;
}

}  // namespace lockstep::optim
