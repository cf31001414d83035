#pragma once
// The element-wise sum of the ranks' slots behind the shared-memory all-reduce and reduce-scatter
// (Note [Collectives through shared memory]): ranks in order, so every rank gets the same bits and
// two ranks get exactly Gloo's a + b; 16-bit floats are summed in fp32 and rounded once.

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace lockstep::dist::shm {

template <typename T>
void sum_into(T* __restrict out, const std::vector<const T*>& in, int64_t n) {
  const T* __restrict a = in[0];
  const T* __restrict b = in[1];
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  for (size_t q = 2; q < in.size(); ++q) {
    const T* __restrict c = in[q];
    for (int64_t i = 0; i < n; ++i) out[i] += c[i];
  }
}

template <typename T>  // c10::Half, c10::BFloat16
void sum_16_bit(T* out, const std::vector<const T*>& in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float acc = static_cast<float>(in[0][i]) + static_cast<float>(in[1][i]);
    for (size_t q = 2; q < in.size(); ++q) acc += static_cast<float>(in[q][i]);
    out[i] = static_cast<T>(acc);
  }
}

// out[i] = in[0][i] + in[1][i] + ... for n elements of `dtype`: fp32, fp64, fp16 or bf16; two or
// more inputs.
inline void sum_slices(c10::ScalarType dtype, void* out, const std::vector<const void*>& in, int64_t n) {
  if (n == 0) return;
  const auto typed = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    std::vector<const T*> slices;
    for (const void* p : in) slices.push_back(static_cast<const T*>(p));
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      sum_into(static_cast<T*>(out), slices, n);
    } else {
      sum_16_bit(static_cast<T*>(out), slices, n);
    }
  };
  switch (dtype) {
    case c10::ScalarType::Float: typed(static_cast<float*>(nullptr)); break;
    case c10::ScalarType::Double: typed(static_cast<double*>(nullptr)); break;
    case c10::ScalarType::Half: typed(static_cast<c10::Half*>(nullptr)); break;
    default: typed(static_cast<c10::BFloat16*>(nullptr)); break;  // the callers accept nothing else
  }
}

}  // namespace lockstep::dist::shm
