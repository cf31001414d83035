#include "norm_relu_pool_kernels.h"

#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>

namespace lockstep::models::norm_relu_pool_kernels {

bool avx2_available() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

// What follows is compiled for AVX2 and FMA; everything else in lockstep keeps the baseline ISA.
#pragma GCC push_options
#pragma GCC target("avx2,fma")

namespace {

// Eight consecutive windows take 16 floats of each of their two rows. A row's last windows, when
// fewer than eight, are copied into a zero-padded chunk of 16 and run the same code.
constexpr int64_t kLanes = 8;

using BFloat16 = c10::BFloat16;

// Eight values as fp32 lanes, and back: bf16 widens exactly and narrows as c10::BFloat16 does
// (round to nearest even; a NaN becomes 0x7fc0).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline __m256i bf16_bits(__m256 v) {  // (8) int32 lanes holding the bf16 bits
  const __m256i i = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(i, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(i, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), nan);
}
inline void store8(BFloat16* p, __m256 v) {
  const __m256i bits = bf16_bits(v);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), _MM_SHUFFLE(3, 1, 2, 0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
// v as the element type rounds it: LibTorch's BatchNorm writes bf16 before ReLU and the pool compare.
inline __m256 rounded(__m256 v, const float*) { return v; }
inline __m256 rounded(__m256 v, const BFloat16*) { return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(v), 16)); }

// p[0..16) -> even (p0, p2, ..., p14) and odd (p1, p3, ..., p15).
template <typename T>
inline void deinterleave(const T* p, __m256& even, __m256& odd) {
  const __m256 lo = load8(p), hi = load8(p + 8);
  // Within each 128-bit half: (lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6); the 64-bit pairs reordered.
  const __m256 e = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
  const __m256 o = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
  even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
  odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
}

// deinterleave's inverse: p[0..16) = (e0, o0, e1, o1, ..., e7, o7).
template <typename T>
inline void interleave(__m256 even, __m256 odd, T* p) {
  const __m256 lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
  store8(p, _mm256_permute2f128_ps(lo, hi, 0x20));
  store8(p + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}

// The four positions of eight windows, in row-major order: top-left, top-right, bottom-left, bottom-right.
template <typename T>
inline void load_windows(const T* r0, const T* r1, __m256 v[4]) {
  deinterleave(r0, v[0], v[1]);
  deinterleave(r1, v[2], v[3]);
}

// Eight codes (bytes) as int32 lanes, and back.
inline __m256i load_codes(const uint8_t* code) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(code)));
}
inline void store_codes(__m256 j, uint8_t* code) {
  const __m256i i = _mm256_cvttps_epi32(j);
  const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(code), _mm_packus_epi16(words, words));
}
inline __m256 code_is(__m256i codes, int k) {
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(codes, _mm256_set1_epi32(k)));
}

template <typename T>
void pool_chunk(const T* r0, const T* r1, __m256 a, __m256 b, T* out, float* winner, uint8_t* code) {
  __m256 v[4];
  load_windows(r0, r1, v);
  __m256 m = rounded(_mm256_fmadd_ps(v[0], a, b), r0), x = v[0], j = _mm256_setzero_ps();
  for (int k = 1; k < 4; ++k) {
    const __m256 z = rounded(_mm256_fmadd_ps(v[k], a, b), r0);
    const __m256 wins = _mm256_or_ps(_mm256_cmp_ps(z, m, _CMP_GT_OQ), _mm256_cmp_ps(z, z, _CMP_UNORD_Q));
    m = _mm256_blendv_ps(m, z, wins);
    x = _mm256_blendv_ps(x, v[k], wins);
    j = _mm256_blendv_ps(j, _mm256_set1_ps(float(k)), wins);
  }
  const __m256 zeroed = _mm256_cmp_ps(m, _mm256_setzero_ps(), _CMP_LE_OQ);  // false for a NaN: ReLU keeps it
  store8(out, _mm256_andnot_ps(zeroed, m));
  _mm256_storeu_ps(winner, x);
  store_codes(_mm256_blendv_ps(j, _mm256_set1_ps(float(kZeroed)), zeroed), code);
}

template <typename T>
void grad_chunk(const T* r0, const T* r1, __m256 mean, __m256 a, __m256 b, const T* g, const uint8_t* code,
                __m256 scale, T* out0, T* out1) {
  __m256 v[4];
  load_windows(r0, r1, v);
  const __m256i codes = load_codes(code);
  const __m256 gs = _mm256_mul_ps(scale, load8(g));
  for (int k = 0; k < 4; ++k) {
    const __m256 base = _mm256_fmadd_ps(a, _mm256_sub_ps(v[k], mean), b);
    v[k] = _mm256_add_ps(base, _mm256_and_ps(code_is(codes, k), gs));
  }
  interleave(v[0], v[1], out0);
  interleave(v[2], v[3], out1);
}

double sum_lanes(__m256 v) {
  alignas(32) float f[kLanes];
  _mm256_store_ps(f, v);
  double s = 0;
  for (float x : f) s += x;
  return s;
}

// A row's last `count` < 8 windows, zero-padded: rows of 16 floats, g 0 and codes kZeroed beyond.
template <typename T>
struct Tail {
  alignas(32) T r0[2 * kLanes] = {}, r1[2 * kLanes] = {}, g[kLanes] = {};
  alignas(32) uint8_t code[kLanes];
  Tail(const T* x0, const T* x1, int64_t count) {
    std::copy(x0, x0 + 2 * count, r0);
    std::copy(x1, x1 + 2 * count, r1);
    std::fill(code, code + kLanes, kZeroed);
  }
  Tail(const T* x0, const T* x1, const T* g_in, const uint8_t* code_in, int64_t count) : Tail(x0, x1, count) {
    std::copy(g_in, g_in + count, g);
    std::copy(code_in, code_in + count, code);
  }
};

}  // namespace

template <typename T>
void shifted_sums(const T* x, int64_t n, float shift, double& s1, double& s2) {
  const __m256 sh = _mm256_set1_ps(shift);
  __m256d a = _mm256_setzero_pd(), b = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m256 d = _mm256_sub_ps(load8(x + i), sh);
    for (const __m256d e : {_mm256_cvtps_pd(_mm256_castps256_ps128(d)), _mm256_cvtps_pd(_mm256_extractf128_ps(d, 1))}) {
      a = _mm256_add_pd(a, e);
      b = _mm256_fmadd_pd(e, e, b);
    }
  }
  alignas(32) double u[4], v[4];
  _mm256_store_pd(u, a);
  _mm256_store_pd(v, b);
  double p = u[0] + u[1] + u[2] + u[3], q = v[0] + v[1] + v[2] + v[3];
  for (; i < n; ++i) {
    const double d = float(x[i]) - shift;
    p += d, q += d * d;
  }
  s1 += p, s2 += q;
}

template <typename T>
void pool_plane(const T* x, int64_t h, int64_t w, float a, float b, T* out, float* winner, uint8_t* code) {
  const int64_t oh = h / 2, ow = w / 2, full = ow - ow % kLanes;
  const __m256 av = _mm256_set1_ps(a), bv = _mm256_set1_ps(b);
  for (int64_t oy = 0; oy < oh; ++oy, out += ow, winner += ow, code += ow) {
    const T* r0 = x + 2 * oy * w;
    const T* r1 = r0 + w;
    for (int64_t ox = 0; ox < full; ox += kLanes)
      pool_chunk(r0 + 2 * ox, r1 + 2 * ox, av, bv, out + ox, winner + ox, code + ox);
    if (full == ow) continue;
    Tail<T> t(r0 + 2 * full, r1 + 2 * full, ow - full);
    alignas(32) T o[kLanes];
    alignas(32) float xw[kLanes];
    alignas(32) uint8_t k[kLanes];
    pool_chunk(t.r0, t.r1, av, bv, o, xw, k);
    std::copy(o, o + (ow - full), out + full);
    std::copy(xw, xw + (ow - full), winner + full);
    std::copy(k, k + (ow - full), code + full);
  }
}

template <typename T>
void winner_sums(const float* winner, const T* g, const uint8_t* code, int64_t n, float mean, double& s, double& sx) {
  const __m256 mv = _mm256_set1_ps(mean), all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  __m256 sv = _mm256_setzero_ps(), sxv = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m256 valid = _mm256_xor_ps(code_is(load_codes(code + i), kZeroed), all);
    const __m256 gv = _mm256_and_ps(valid, load8(g + i));
    sv = _mm256_add_ps(sv, gv);
    sxv = _mm256_fmadd_ps(gv, _mm256_and_ps(valid, _mm256_sub_ps(_mm256_loadu_ps(winner + i), mv)), sxv);
  }
  double u = sum_lanes(sv), v = sum_lanes(sxv);
  for (; i < n; ++i)
    if (code[i] != kZeroed) u += float(g[i]), v += double(float(g[i])) * (winner[i] - mean);
  s += u, sx += v;
}

template <typename T>
void grad_plane(const T* x, int64_t h, int64_t w, float mean, float a, float b, const T* g, const uint8_t* code,
                float scale, T* gx) {
  const int64_t oh = h / 2, ow = w / 2, full = ow - ow % kLanes;
  const __m256 mv = _mm256_set1_ps(mean), av = _mm256_set1_ps(a), bv = _mm256_set1_ps(b), sv = _mm256_set1_ps(scale);
  for (int64_t oy = 0; oy < oh; ++oy, g += ow, code += ow) {
    const T* r0 = x + 2 * oy * w;
    const T* r1 = r0 + w;
    T* o0 = gx + 2 * oy * w;
    T* o1 = o0 + w;
    for (int64_t ox = 0; ox < full; ox += kLanes)
      grad_chunk(r0 + 2 * ox, r1 + 2 * ox, mv, av, bv, g + ox, code + ox, sv, o0 + 2 * ox, o1 + 2 * ox);
    if (full == ow) continue;
    Tail<T> t(r0 + 2 * full, r1 + 2 * full, g + full, code + full, ow - full);
    alignas(32) T q0[2 * kLanes], q1[2 * kLanes];
    grad_chunk(t.r0, t.r1, mv, av, bv, t.g, t.code, sv, q0, q1);
    std::copy(q0, q0 + 2 * (ow - full), o0 + 2 * full);
    std::copy(q1, q1 + 2 * (ow - full), o1 + 2 * full);
  }
}

#define LOCKSTEP_INSTANTIATE(T)                                                                                  \
  template void shifted_sums(const T*, int64_t, float, double&, double&);                                        \
  template void pool_plane(const T*, int64_t, int64_t, float, float, T*, float*, uint8_t*);                      \
  template void winner_sums(const float*, const T*, const uint8_t*, int64_t, float, double&, double&);           \
  template void grad_plane(const T*, int64_t, int64_t, float, float, float, const T*, const uint8_t*, float, T*);
LOCKSTEP_INSTANTIATE(float)
LOCKSTEP_INSTANTIATE(c10::BFloat16)
#undef LOCKSTEP_INSTANTIATE

#pragma GCC pop_options

}  // namespace lockstep::models::norm_relu_pool_kernels
