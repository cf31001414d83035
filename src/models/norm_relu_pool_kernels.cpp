#include "norm_relu_pool_kernels.h"

#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>

#include "../core/cpu_isa.h"

namespace lockstep::models::norm_relu_pool_kernels {

// What follows is compiled for AVX2 and FMA; everything else in lockstep keeps the baseline ISA.
LOCKSTEP_AVX2_FMA_BEGIN

namespace {

// Eight consecutive windows take 16 values of each of their two rows. A row's last windows, when
// fewer than eight (all of them where the row has fewer), run the same code on masked loads: the
// lanes past them read 0 and are never written. A 14x14 plane has rows of 7 windows, so for the
// convnet's second block that is every window: copying such rows into a zero-padded chunk instead
// made its forward pass over (100, 32, 14, 14) take 0.81 ms rather than 0.34 (fp32, one thread,
// bench/norm_relu_pool_kernels.cpp).
constexpr int64_t kLanes = 8;

using BFloat16 = c10::BFloat16;

// The int32 lanes below n (none for n <= 0, all for n >= 8).
inline __m256i lanes_below(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Eight values as fp32 lanes, and back: bf16 widens exactly and narrows as c10::BFloat16 does
// (round to nearest even; a NaN becomes 0x7fc0).
inline __m256 widen(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const BFloat16* p) { return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline __m256i bf16_bits(__m256 v) {  // (8) int32 lanes holding the bf16 bits
  const __m256i i = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(i, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(i, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), nan);
}
// Sixteen bf16 (lo's eight, then hi's) in one vector.
inline __m256i bf16_pack(__m256 lo, __m256 hi) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_bits(lo), bf16_bits(hi)), _MM_SHUFFLE(3, 1, 2, 0));
}
inline void store8(BFloat16* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(bf16_pack(v, v)));
}
// v as the element type rounds it: LibTorch's BatchNorm writes bf16 before ReLU and the pool compare.
inline __m256 rounded(__m256 v, const float*) { return v; }
inline __m256 rounded(__m256 v, const BFloat16*) { return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(v), 16)); }

// p[0..2 * windows) as fp32 lanes lo (p0..p7) and hi (p8..p15), zero past them.
inline void load16(const float* p, int64_t windows, __m256& lo, __m256& hi) {
  if (windows == kLanes) {
    lo = _mm256_loadu_ps(p), hi = _mm256_loadu_ps(p + 8);
    return;
  }
  lo = _mm256_maskload_ps(p, lanes_below(2 * windows));
  hi = _mm256_maskload_ps(p + 8, lanes_below(2 * windows - 8));
}
inline void load16(const BFloat16* p, int64_t windows, __m256& lo, __m256& hi) {
  // A window's two bf16 are one 32-bit lane.
  const __m256i v = windows == kLanes ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                      : _mm256_maskload_epi32(reinterpret_cast<const int*>(p), lanes_below(windows));
  lo = widen(_mm256_castsi256_si128(v)), hi = widen(_mm256_extracti128_si256(v, 1));
}
// load16's inverse: p[0..2 * windows) written, nothing past them.
inline void store16(float* p, int64_t windows, __m256 lo, __m256 hi) {
  if (windows == kLanes) {
    _mm256_storeu_ps(p, lo), _mm256_storeu_ps(p + 8, hi);
    return;
  }
  _mm256_maskstore_ps(p, lanes_below(2 * windows), lo);
  _mm256_maskstore_ps(p + 8, lanes_below(2 * windows - 8), hi);
}
inline void store16(BFloat16* p, int64_t windows, __m256 lo, __m256 hi) {
  const __m256i v = bf16_pack(lo, hi);
  if (windows == kLanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
    return;
  }
  _mm256_maskstore_epi32(reinterpret_cast<int*>(p), lanes_below(windows), v);
}

// p[0..16) -> even (p0, p2, ..., p14) and odd (p1, p3, ..., p15), of `windows` (even, odd) pairs.
template <typename T>
inline void deinterleave(const T* p, int64_t windows, __m256& even, __m256& odd) {
  __m256 lo, hi;
  load16(p, windows, lo, hi);
  // Within each 128-bit half: (lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6); the 64-bit pairs reordered.
  const __m256 e = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
  const __m256 o = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
  even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
  odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
}

// deinterleave's inverse: p[0..2 * windows) = (e0, o0, e1, o1, ...).
template <typename T>
inline void interleave(__m256 even, __m256 odd, int64_t windows, T* p) {
  const __m256 lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
  store16(p, windows, _mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}

// The four positions of eight windows, in row-major order: top-left, top-right, bottom-left, bottom-right.
template <typename T>
inline void load_windows(const T* r0, const T* r1, int64_t windows, __m256 v[4]) {
  deinterleave(r0, windows, v[0], v[1]);
  deinterleave(r1, windows, v[2], v[3]);
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

// Eight windows' outputs (the first `windows` of them written).
template <typename T>
void pool_chunk(const T* r0, const T* r1, int64_t windows, __m256 a, __m256 b, T* out, float* winner, uint8_t* code) {
  __m256 v[4];
  load_windows(r0, r1, windows, v);
  __m256 m = rounded(_mm256_fmadd_ps(v[0], a, b), r0), x = v[0], j = _mm256_setzero_ps();
  for (int k = 1; k < 4; ++k) {
    const __m256 z = rounded(_mm256_fmadd_ps(v[k], a, b), r0);
    const __m256 wins = _mm256_or_ps(_mm256_cmp_ps(z, m, _CMP_GT_OQ), _mm256_cmp_ps(z, z, _CMP_UNORD_Q));
    m = _mm256_blendv_ps(m, z, wins);
    x = _mm256_blendv_ps(x, v[k], wins);
    j = _mm256_blendv_ps(j, _mm256_set1_ps(float(k)), wins);
  }
  const __m256 zeroed = _mm256_cmp_ps(m, _mm256_setzero_ps(), _CMP_LE_OQ);  // false for a NaN: ReLU keeps it
  const __m256 y = _mm256_andnot_ps(zeroed, m), c = _mm256_blendv_ps(j, _mm256_set1_ps(float(kZeroed)), zeroed);
  if (windows == kLanes) {
    store8(out, y);
    _mm256_storeu_ps(winner, x);
    store_codes(c, code);
    return;
  }
  alignas(32) T y8[kLanes];
  alignas(8) uint8_t c8[kLanes];
  store8(y8, y);
  store_codes(c, c8);
  _mm256_maskstore_ps(winner, lanes_below(windows), x);
  std::copy(y8, y8 + windows, out);
  std::copy(c8, c8 + windows, code);
}

// Eight windows' input gradients (the first `windows` of them read and written).
template <typename T>
void grad_chunk(const T* r0, const T* r1, int64_t windows, __m256 mean, __m256 a, __m256 b, const T* g,
                const uint8_t* code, __m256 scale, T* out0, T* out1) {
  __m256 v[4];
  load_windows(r0, r1, windows, v);
  alignas(32) T g8[kLanes];
  alignas(8) uint8_t c8[kLanes];
  if (windows < kLanes) {  // their g and codes, padded (whole chunks read theirs in place)
    std::fill(std::copy(g, g + windows, g8), g8 + kLanes, T(0));
    std::fill(std::copy(code, code + windows, c8), c8 + kLanes, kZeroed);
    g = g8, code = c8;
  }
  const __m256i codes = load_codes(code);
  const __m256 gs = _mm256_mul_ps(scale, load8(g));
  for (int k = 0; k < 4; ++k) {
    const __m256 base = _mm256_fmadd_ps(a, _mm256_sub_ps(v[k], mean), b);
    v[k] = _mm256_add_ps(base, _mm256_and_ps(code_is(codes, k), gs));
  }
  interleave(v[0], v[1], windows, out0);
  interleave(v[2], v[3], windows, out1);
}

double sum_lanes(__m256 v) {
  alignas(32) float f[kLanes];
  _mm256_store_ps(f, v);
  double s = 0;
  for (float x : f) s += x;
  return s;
}

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
  const int64_t oh = h / 2, ow = w / 2;
  const __m256 av = _mm256_set1_ps(a), bv = _mm256_set1_ps(b);
  for (int64_t oy = 0; oy < oh; ++oy, out += ow, winner += ow, code += ow) {
    const T* r0 = x + 2 * oy * w;
    const T* r1 = r0 + w;
    for (int64_t ox = 0; ox < ow; ox += kLanes)
      pool_chunk(r0 + 2 * ox, r1 + 2 * ox, std::min(kLanes, ow - ox), av, bv, out + ox, winner + ox, code + ox);
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
  const int64_t oh = h / 2, ow = w / 2;
  const __m256 mv = _mm256_set1_ps(mean), av = _mm256_set1_ps(a), bv = _mm256_set1_ps(b), sv = _mm256_set1_ps(scale);
  for (int64_t oy = 0; oy < oh; ++oy, g += ow, code += ow) {
    const T* r0 = x + 2 * oy * w;
    const T* r1 = r0 + w;
    T* o0 = gx + 2 * oy * w;
    T* o1 = o0 + w;
    for (int64_t ox = 0; ox < ow; ox += kLanes)
      grad_chunk(r0 + 2 * ox, r1 + 2 * ox, std::min(kLanes, ow - ox), mv, av, bv, g + ox, code + ox, sv, o0 + 2 * ox,
                 o1 + 2 * ox);
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

LOCKSTEP_AVX2_FMA_END

}  // namespace lockstep::models::norm_relu_pool_kernels
