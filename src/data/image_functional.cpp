// torchvision.transforms.functional on the PIL path (resize is in resample.cpp).
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#include "functional_internal.h"
#include "lockstep/data/transforms.h"

namespace lockstep::data::functional {

std::pair<int64_t, int64_t> resized_size(int64_t h, int64_t w, const std::vector<int64_t>& size,
                                         std::optional<int64_t> max_size) {
  if (size.size() == 2) return {size[0], size[1]};
  const int64_t shorter = std::min(h, w), longer = std::max(h, w);
  int64_t new_short = size.at(0);
  // Python's int(size * long / short): a correctly rounded division, then truncation.
  int64_t new_long = static_cast<int64_t>(static_cast<double>(new_short * longer) / static_cast<double>(shorter));
  if (max_size && new_long > *max_size) {
    new_short = static_cast<int64_t>(static_cast<double>(*max_size * new_short) / static_cast<double>(new_long));
    new_long = *max_size;
  }
  return w <= h ? std::pair{new_long, new_short} : std::pair{new_short, new_long};
}

torch::Tensor crop(const torch::Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width) {
  check_image(image, "crop");
  TORCH_CHECK(height >= 0 && width >= 0, "crop: negative size ", height, " x ", width);
  check_output_size("crop", height, width);
  auto out = torch::zeros({height, width, image.size(2)}, torch::kUInt8);
  const int64_t y0 = std::max<int64_t>(top, 0), y1 = std::min(top + height, image.size(0));
  const int64_t x0 = std::max<int64_t>(left, 0), x1 = std::min(left + width, image.size(1));
  if (y0 < y1 && x0 < x1)
    out.slice(0, y0 - top, y1 - top).slice(1, x0 - left, x1 - left).copy_(image.slice(0, y0, y1).slice(1, x0, x1));
  return out;
}

torch::Tensor resized_crop(const torch::Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width,
                           int64_t out_height, int64_t out_width) {
  return resize(crop(image, top, left, height, width), out_height, out_width);
}

// torchvision pads a too-small image (the odd pixel right and below), then crops at
// round((H - h) / 2), Python's round.
torch::Tensor center_crop(const torch::Tensor& image, int64_t height, int64_t width) {
  check_image(image, "center_crop");
  torch::Tensor source = image;
  if (height > image.size(0) || width > image.size(1)) {
    const int64_t dh = std::max<int64_t>(height - image.size(0), 0), dw = std::max<int64_t>(width - image.size(1), 0);
    source = pad(image, dw / 2, dh / 2, (dw + 1) / 2, (dh + 1) / 2, {0});
    if (source.size(0) == height && source.size(1) == width) return source;
  }
  const int64_t top = python_round(static_cast<double>(source.size(0) - height) / 2.0);
  const int64_t left = python_round(static_cast<double>(source.size(1) - width) / 2.0);
  return crop(source, top, left, height, width);
}

torch::Tensor pad(const torch::Tensor& image, int64_t left, int64_t top, int64_t right, int64_t bottom,
                  const std::vector<int64_t>& fill) {
  check_image(image, "pad");
  const int64_t channels = image.size(2);
  TORCH_CHECK(left >= 0 && top >= 0 && right >= 0 && bottom >= 0, "pad: negative padding (left ", left, ", top ",
              top, ", right ", right, ", bottom ", bottom, ")");
  TORCH_CHECK(fill.size() == 1 || static_cast<int64_t>(fill.size()) == channels, "pad: fill has ", fill.size(),
              " values for an image of ", channels, " channels");
  check_output_size("pad", image.size(0) + top + bottom, image.size(1) + left + right);
  auto out = torch::empty({image.size(0) + top + bottom, image.size(1) + left + right, channels}, torch::kUInt8);
  std::vector<uint8_t> colour(channels);
  for (int64_t c = 0; c < channels; ++c) colour[c] = static_cast<uint8_t>(fill.size() == 1 ? fill[0] : fill[c]);
  out.copy_(torch::from_blob(colour.data(), {1, 1, channels}, torch::kUInt8).expand_as(out));
  out.slice(0, top, top + image.size(0)).slice(1, left, left + image.size(1)).copy_(image);
  return out;
}

torch::Tensor hflip(const torch::Tensor& image) {
  check_image(image, "hflip");
  return image.flip({1});
}

torch::Tensor to_grayscale(const torch::Tensor& image, int64_t num_output_channels) {
  check_image(image, "to_grayscale");
  TORCH_CHECK(num_output_channels == 1 || num_output_channels == 3,
              "to_grayscale: num_output_channels must be 1 or 3, got ", num_output_channels);
  torch::Tensor grey;
  if (image.size(2) == 1) {
    grey = image;
  } else {
    TORCH_CHECK(image.size(2) == 3, "to_grayscale: expected 1 or 3 channels, got ", image.sizes());
    const torch::Tensor rgb = image.contiguous();
    grey = torch::empty({image.size(0), image.size(1), 1}, torch::kUInt8);
    const uint8_t* in = rgb.data_ptr<uint8_t>();
    uint8_t* out = grey.data_ptr<uint8_t>();
    // PIL's convert("L"): 0.299 R + 0.587 G + 0.114 B in 16-bit fixed point, rounded.
    for (int64_t i = 0, n = grey.numel(); i < n; ++i)
      out[i] = static_cast<uint8_t>((in[3 * i] * 19595u + in[3 * i + 1] * 38470u + in[3 * i + 2] * 7471u + 0x8000u) >> 16);
  }
  return num_output_channels == 3 ? grey.expand({-1, -1, 3}).contiguous() : grey;
}

torch::Tensor to_tensor(const torch::Tensor& image) {
  check_image(image, "ToTensor");
  return image.permute({2, 0, 1}).contiguous().to(torch::kFloat).div(255);
}

}  // namespace lockstep::data::functional
