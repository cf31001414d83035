#pragma once
// What the transforms (transforms.cpp) and their functional forms (image_functional.cpp) share.

#include <c10/util/Exception.h>
#include <torch/types.h>

#include <cmath>
#include <cstdint>

namespace lockstep::data::functional {

inline void check_image(const torch::Tensor& image, const char* what) {
  TORCH_CHECK(image.dim() == 3 && image.scalar_type() == torch::kUInt8, what,
              ": expected a uint8 (H, W, C) image (before ToTensor), got ", image.scalar_type(), " ", image.sizes());
}

inline int64_t python_round(double x) { return static_cast<int64_t>(std::nearbyint(x)); }  // half to even

}  // namespace lockstep::data::functional
