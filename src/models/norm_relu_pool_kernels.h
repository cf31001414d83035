#pragma once

#include <cstdint>

// The per-plane loops of Note [BatchNorm, ReLU and the max-pool as one function in training]
// (norm_relu_pool.cpp), in AVX2 and FMA: call them only where cpu_has_avx2_fma() says so. A plane is
// one (image, channel)'s (H, W) values, H and W even; its windows are the 2x2 blocks of the
// max-pool, its outputs and codes (H/2, W/2). A code is the window's winner, 0-3 in row-major order
// (the first maximum; a NaN wins), or kZeroed where the maximum is <= 0 and ReLU passes no gradient.
// T is float or c10::BFloat16 (autocast's convolution output: computed in fp32, the normalised
// values rounded to bf16 before ReLU and the pool compare them, as LibTorch's BatchNorm writes them).
namespace lockstep::models::norm_relu_pool_kernels {

constexpr uint8_t kZeroed = 4;

// s1 += sum(x - shift), s2 += sum((x - shift)^2) over n values, x - shift in fp32, the sums in fp64.
template <typename T>
void shifted_sums(const T* x, int64_t n, float shift, double& s1, double& s2);

// out = ReLU(max over each window of a * x + b), winner = the winner's x, code as above.
template <typename T>
void pool_plane(const T* x, int64_t h, int64_t w, float a, float b, T* out, float* winner, uint8_t* code);

// s += sum of g, sx += sum of g * (winner - mean) over n outputs, those with code kZeroed left out.
template <typename T>
void winner_sums(const float* winner, const T* g, const uint8_t* code, int64_t n, float mean, double& s,
                 double& sx);

// gx = a * (x - mean) + b, plus scale * g at each window's winner. gx (H, W).
template <typename T>
void grad_plane(const T* x, int64_t h, int64_t w, float mean, float a, float b, const T* g, const uint8_t* code,
                float scale, T* gx);

}  // namespace lockstep::models::norm_relu_pool_kernels
