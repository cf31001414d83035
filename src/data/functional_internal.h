#pragma once
// What the transforms (transforms.cpp) and their functional forms (image_functional.cpp) share.

#include <c10/util/Exception.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "lockstep/data/image.h"

namespace lockstep::data::functional {

inline void check_image(const torch::Tensor& image, const char* what) {
  TORCH_CHECK(image.dim() == 3 && image.scalar_type() == torch::kUInt8, what,
              ": expected a uint8 (H, W, C) image (before ToTensor), got ", image.scalar_type(), " ", image.sizes());
}

// An image a transform is about to make: at most kMaxImagePixels, as a decoded one.
inline void check_output_size(const char* what, int64_t height, int64_t width) {
  TORCH_CHECK_VALUE(height <= kMaxImagePixels / std::max<int64_t>(width, 1), what, ": an output of ", height, " x ",
                    width, " pixels is more than the ", kMaxImagePixels,
                    " an image may have (PIL's limit); make the sizes or the padding smaller");
}

inline int64_t python_round(double x) { return static_cast<int64_t>(std::nearbyint(x)); }  // half to even

}  // namespace lockstep::data::functional
