#pragma once

namespace lockstep {

// Whether this CPU runs AVX2 and FMA instructions. The kernels compiled for them (under
// `#pragma GCC target("avx2,fma")`; lockstep otherwise keeps the baseline x86-64 ISA) are called
// only where this says so, and LibTorch's own operators run elsewhere.
bool cpu_has_avx2_fma();

}  // namespace lockstep
