// functional::resize: PIL's bilinear resampling of 8-bit images, bit for bit.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "functional_internal.h"
#include "lockstep/data/transforms.h"

namespace lockstep::data::functional {
namespace {

// Note [PIL's fixed-point resampling]
// torchvision resizes a PIL image with PIL's Image.resize(BILINEAR), and a model trained in Python
// has seen exactly those pixels, so we reproduce its arithmetic rather than any bilinear filter:
//  - Each output pixel i of an axis of `in` -> `out` samples is centred at (i + 0.5) * in / out in
//    input coordinates. The triangle filter is stretched by the downscale factor when shrinking
//    (that is the antialiasing), so it covers `support` = max(in / out, 1) input pixels each side;
//    the taps run over the rounded window [center - support, center + support), clipped to the
//    image, and their weights are normalised to sum to 1.
//  - The weights then become integers scaled by 2^22 (32 bits minus 8 for the sample, minus 2 of
//    headroom for negative lobes of other filters), rounded half away from zero; a pixel is the
//    integer sum plus 2^21, shifted right by 22 and clipped to 0..255.
//  - Rows are resampled first (only the input rows the vertical taps reach), then columns, each
//    pass rounding to uint8; an axis whose size does not change is not resampled at all.
// Same inputs, same integer operations, same order: the result equals PIL's exactly, and the
// tests compare against PIL with tolerance 0.
constexpr int kPrecisionBits = 32 - 8 - 2;

// The taps of one axis: output sample i reads input [first[i], first[i] + count[i]) with weights
// weights[i * stride ...].
struct Taps {
  std::vector<int> first, count;
  std::vector<int32_t> weights;
  int stride = 0;
};

Taps make_taps(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // the triangle's support is 1 input pixel, stretched
  Taps taps;
  taps.stride = static_cast<int>(std::ceil(support)) * 2 + 1;
  taps.first.resize(out_size);
  taps.count.resize(out_size);
  taps.weights.assign(static_cast<size_t>(out_size) * taps.stride, 0);
  std::vector<double> w(taps.stride);
  const double inverse_scale = 1.0 / filter_scale;  // multiplied, not divided: PIL's rounding
  for (int i = 0; i < out_size; ++i) {
    const double center = (i + 0.5) * scale;
    // C's truncating conversions, as PIL rounds the window's ends.
    const int first = std::max(static_cast<int>(center - support + 0.5), 0);
    const int count = std::min(static_cast<int>(center + support + 0.5), in_size) - first;
    double total = 0;
    for (int k = 0; k < count; ++k) {
      const double x = std::abs((k + first - center + 0.5) * inverse_scale);
      w[k] = x < 1.0 ? 1.0 - x : 0.0;
      total += w[k];
    }
    for (int k = 0; k < count; ++k) {
      const double normalised = total != 0.0 ? w[k] / total : w[k];
      const double scaled = normalised * (1 << kPrecisionBits);
      taps.weights[static_cast<size_t>(i) * taps.stride + k] =
          static_cast<int32_t>(scaled < 0 ? scaled - 0.5 : scaled + 0.5);
    }
    taps.first[i] = first;
    taps.count[i] = count;
  }
  return taps;
}

inline uint8_t clip8(int32_t sum) {
  const int32_t v = sum >> kPrecisionBits;  // arithmetic shift: floor, as PIL
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// Rows [row0, row0 + rows) of `in` (rows x in_w x C samples in memory after in + row0 * in_w * C)
// resampled along x into `out`, (rows, out_w, C).
template <int C>
void resample_rows(const uint8_t* in, int in_w, int row0, int rows, const Taps& taps, int out_w, uint8_t* out) {
  for (int y = 0; y < rows; ++y) {
    const uint8_t* src = in + (static_cast<size_t>(row0) + y) * in_w * C;
    uint8_t* dst = out + static_cast<size_t>(y) * out_w * C;
    for (int x = 0; x < out_w; ++x) {
      const int32_t* k = &taps.weights[static_cast<size_t>(x) * taps.stride];
      const uint8_t* s = src + static_cast<size_t>(taps.first[x]) * C;
      int32_t sum[C];
      for (int c = 0; c < C; ++c) sum[c] = 1 << (kPrecisionBits - 1);
      for (int t = 0; t < taps.count[x]; ++t)
        for (int c = 0; c < C; ++c) sum[c] += s[t * C + c] * k[t];
      for (int c = 0; c < C; ++c) dst[x * C + c] = clip8(sum[c]);
    }
  }
}

// `in`, (in_h, row) samples, resampled along y into `out`, (out_h, row); the taps' first rows
// are counted from `in`'s first row minus `shift`.
void resample_columns(const uint8_t* in, size_t row, const Taps& taps, int shift, int out_h, uint8_t* out) {
  std::vector<int32_t> sum(row);
  for (int y = 0; y < out_h; ++y) {
    std::fill(sum.begin(), sum.end(), 1 << (kPrecisionBits - 1));
    const int32_t* k = &taps.weights[static_cast<size_t>(y) * taps.stride];
    for (int t = 0; t < taps.count[y]; ++t) {
      const uint8_t* src = in + static_cast<size_t>(taps.first[y] - shift + t) * row;
      const int32_t weight = k[t];
      for (size_t i = 0; i < row; ++i) sum[i] += src[i] * weight;
    }
    uint8_t* dst = out + static_cast<size_t>(y) * row;
    for (size_t i = 0; i < row; ++i) dst[i] = clip8(sum[i]);
  }
}

}  // namespace

torch::Tensor resize(const torch::Tensor& image, int64_t height, int64_t width) {
  TORCH_CHECK(image.dim() == 3 && image.scalar_type() == torch::kUInt8,
              "resize: expected a uint8 (H, W, C) image, got ", image.scalar_type(), " ", image.sizes());
  const int64_t channels = image.size(2);
  TORCH_CHECK(channels == 1 || channels == 3, "resize: expected 1 or 3 channels, got ", image.sizes());
  TORCH_CHECK(height > 0 && width > 0, "resize: the output size must be positive, got ", height, " x ", width);
  check_output_size("resize", height, width);
  const int in_h = static_cast<int>(image.size(0)), in_w = static_cast<int>(image.size(1));
  TORCH_CHECK(in_h > 0 && in_w > 0, "resize: the image is empty, ", image.sizes());
  const torch::Tensor in = image.contiguous();
  if (height == in_h && width == in_w) return in.clone();
  const Taps rows_taps = make_taps(in_w, static_cast<int>(width));
  const Taps column_taps = make_taps(in_h, static_cast<int>(height));

  // The horizontal pass only resamples the rows the vertical taps read (all of them when the
  // height does not change): [first_row, last_row).
  const uint8_t* source = in.data_ptr<uint8_t>();
  int shift = 0;
  torch::Tensor horizontal;
  if (width != in_w) {
    const int first_row = height != in_h ? column_taps.first.front() : 0;
    const int last_row = height != in_h ? column_taps.first.back() + column_taps.count.back() : in_h;
    horizontal = torch::empty({last_row - first_row, width, channels}, torch::kUInt8);
    if (channels == 1)
      resample_rows<1>(source, in_w, first_row, last_row - first_row, rows_taps, static_cast<int>(width),
                       horizontal.data_ptr<uint8_t>());
    else
      resample_rows<3>(source, in_w, first_row, last_row - first_row, rows_taps, static_cast<int>(width),
                       horizontal.data_ptr<uint8_t>());
    if (height == in_h) return horizontal;
    source = horizontal.data_ptr<uint8_t>();
    shift = first_row;
  }
  auto out = torch::empty({height, width, channels}, torch::kUInt8);
  resample_columns(source, static_cast<size_t>(width * channels), column_taps, shift, static_cast<int>(height),
                   out.data_ptr<uint8_t>());
  return out;
}

}  // namespace lockstep::data::functional
