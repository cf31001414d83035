#pragma once

namespace lockstep {

// Whether this CPU runs AVX2 and FMA instructions. The kernels compiled for them (between
// LOCKSTEP_AVX2_FMA_BEGIN and LOCKSTEP_AVX2_FMA_END; lockstep otherwise keeps the baseline x86-64
// ISA) are called only where this says so, and LibTorch's own operators run elsewhere.
bool cpu_has_avx2_fma();

}  // namespace lockstep

// The functions between these two are compiled for AVX2 and FMA: gcc's target pragma, or clang's
// attribute on each function (clang ignores gcc's pragma; the fuzz build is clang's).
#if defined(__clang__)
#define LOCKSTEP_AVX2_FMA_BEGIN _Pragma("clang attribute push(__attribute__((target(\"avx2,fma\"))), apply_to = function)")
#define LOCKSTEP_AVX2_FMA_END _Pragma("clang attribute pop")
#else
#define LOCKSTEP_AVX2_FMA_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma\")")
#define LOCKSTEP_AVX2_FMA_END _Pragma("GCC pop_options")
#endif
