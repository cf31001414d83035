#pragma once

#include <torch/types.h>

namespace lockstep::amp {

// torch.autocast for LibTorch, as an RAII guard. While it lives, ops on the autocast lists run in
// `dtype` on `device` (matmul, linear, conv in the low precision; softmax, losses, norms in fp32),
// exactly as in Python: it sets the thread's autocast flag and dtype for `device` and restores the
// previous ones on exit. Guards nest; an inner `enabled = false` guard runs its region in full
// precision. When the outermost guard exits, the cache of low-precision weight copies is cleared
// (Note [Autocast weight cache]).
//
//   {
//     lockstep::amp::AutocastGuard autocast;                   // CPU, bf16
//     auto logits = model->forward(x);                         // bf16 activations
//     auto loss = torch::nn::functional::cross_entropy(logits, y);  // fp32
//   }
//   loss.backward();                                           // outside the guard, as in Python
//
// Allowed: CPU with kBFloat16; CUDA with kHalf or kBFloat16. Anything else is an error naming the
// pair (Python warns and disables; we refuse, so a mistyped precision cannot silently train fp32).
// State is per thread, like PyTorch's.
class AutocastGuard {
 public:
  explicit AutocastGuard(torch::DeviceType device = torch::kCPU,
                         torch::ScalarType dtype = torch::kBFloat16, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  torch::DeviceType device_;
  bool previous_enabled_;
  torch::ScalarType previous_dtype_;
};

// Whether autocast is on for `device` in this thread, and the dtype it casts to.
bool autocast_enabled(torch::DeviceType device = torch::kCPU);
torch::ScalarType autocast_dtype(torch::DeviceType device = torch::kCPU);

}  // namespace lockstep::amp
