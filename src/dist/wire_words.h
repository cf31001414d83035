#pragma once
// Internal to src/dist.

#include <torch/types.h>

namespace lockstep::dist {

// Gloo has no bf16 type; collectives that only move bits (broadcast, all-gather, all-to-all) send
// bf16 as Half, the same 16-bit words. Reductions cannot: see the reducer's bf16 path.
inline torch::Tensor as_wire_words(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 ? t.view(torch::kHalf) : t;
}

}  // namespace lockstep::dist
