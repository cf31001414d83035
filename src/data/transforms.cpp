#include "lockstep/data/transforms.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include "functional_internal.h"
#include "transform_format.h"

namespace lockstep::data {

// --- SampleRandom ------------------------------------------------------------------------------
// xoshiro256** (Blackman and Vigna): 256 bits of state, fast, and passes BigCrush; seeded through
// splitmix64, which hashes (seed, epoch, index) one after the other so that neighbouring indices
// get unrelated streams.
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t xoshiro_next(uint64_t (&s)[4]) {
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

}  // namespace

SampleRandom::SampleRandom(uint64_t seed, int64_t epoch, int64_t index) {
  uint64_t x = seed;
  uint64_t h = splitmix64(x);
  x = h ^ static_cast<uint64_t>(epoch);
  h = splitmix64(x);
  x = h ^ static_cast<uint64_t>(index);
  for (uint64_t& word : state_) word = splitmix64(x);
}

double SampleRandom::uniform() { return static_cast<double>(xoshiro_next(state_) >> 11) * 0x1.0p-53; }

int64_t SampleRandom::integer(int64_t low, int64_t high) {
  TORCH_CHECK(low <= high, "SampleRandom::integer: empty range [", low, ", ", high, "]");
  const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low) + 1;  // 0: all 2^64
  if (range == 0) return static_cast<int64_t>(xoshiro_next(state_));
  // Rejection of the lowest 2^64 mod range values leaves a multiple of `range`: unbiased.
  const uint64_t threshold = (0 - range) % range;
  uint64_t r = xoshiro_next(state_);
  while (r < threshold) r = xoshiro_next(state_);
  return static_cast<int64_t>(static_cast<uint64_t>(low) + r % range);
}

// --- the transforms ----------------------------------------------------------------------------

Resize::Resize(std::vector<int64_t> size, std::optional<int64_t> max_size, std::optional<bool> antialias)
    : size_(std::move(size)), max_size_(max_size), antialias_(antialias) {
  TORCH_CHECK_VALUE(size_.size() == 1 || size_.size() == 2, "Resize: size must be an int or (h, w), got ",
                    format_ints(size_));
  for (int64_t s : size_) TORCH_CHECK_VALUE(s > 0, "Resize: size must be positive, got ", format_ints(size_));
  TORCH_CHECK_VALUE(!max_size_ || size_.size() == 1, "Resize: max_size is only supported for an int size, got size=",
                    format_ints(size_));
  TORCH_CHECK_VALUE(!max_size_ || *max_size_ > size_[0], "Resize: max_size = ", *max_size_,
                    " must be strictly greater than the requested size for the smaller edge size = ", size_[0]);
}

torch::Tensor Resize::apply(const torch::Tensor& image, SampleRandom&) const {
  functional::check_image(image, "Resize");
  const auto [h, w] = functional::resized_size(image.size(0), image.size(1), size_, max_size_);
  return functional::resize(image, h, w);
}

std::string Resize::str() const {
  std::string s = "Resize(" + format_size(size_);
  if (max_size_) s += ", max_size=" + std::to_string(*max_size_);
  if (antialias_) s += std::string(", antialias=") + (*antialias_ ? "True" : "False");
  return s + ")";
}

CenterCrop::CenterCrop(int64_t height, int64_t width) : height_(height), width_(width) {
  TORCH_CHECK_VALUE(height > 0 && width > 0, "CenterCrop: size must be positive, got (", height, ", ", width, ")");
}

torch::Tensor CenterCrop::apply(const torch::Tensor& image, SampleRandom&) const {
  return functional::center_crop(image, height_, width_);
}

std::string CenterCrop::str() const { return "CenterCrop(" + format_hw(height_, width_) + ")"; }

RandomResizedCrop::RandomResizedCrop(int64_t height, int64_t width, std::pair<double, double> scale,
                                     std::pair<double, double> ratio, std::optional<bool> antialias)
    : height_(height), width_(width), scale_(scale), ratio_(ratio), antialias_(antialias) {
  TORCH_CHECK_VALUE(height > 0 && width > 0, "RandomResizedCrop: size must be positive, got (", height, ", ", width,
                    ")");
  TORCH_CHECK_VALUE(0 < scale.first && scale.first <= scale.second, "RandomResizedCrop: scale must be (min, max) with ",
                    "0 < min <= max, got ", format_floats({scale.first, scale.second}));
  TORCH_CHECK_VALUE(0 < ratio.first && ratio.first <= ratio.second, "RandomResizedCrop: ratio must be (min, max) with ",
                    "0 < min <= max, got ", format_floats({ratio.first, ratio.second}));
}

CropParams RandomResizedCrop::params(int64_t h, int64_t w, std::pair<double, double> scale,
                                     std::pair<double, double> ratio, SampleRandom& random) {
  const double area = static_cast<double>(h * w);
  const double log_min = std::log(ratio.first), log_max = std::log(ratio.second);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * (scale.first + (scale.second - scale.first) * random.uniform());
    const double aspect = std::exp(log_min + (log_max - log_min) * random.uniform());
    const int64_t cw = functional::python_round(std::sqrt(target_area * aspect));
    const int64_t ch = functional::python_round(std::sqrt(target_area / aspect));
    if (0 < cw && cw <= w && 0 < ch && ch <= h) {
      const int64_t top = random.integer(0, h - ch);
      const int64_t left = random.integer(0, w - cw);
      return {top, left, ch, cw};
    }
  }
  // The largest central crop whose aspect ratio is within `ratio`.
  const double in_ratio = static_cast<double>(w) / static_cast<double>(h);
  int64_t cw = w, ch = h;
  if (in_ratio < ratio.first) {
    ch = functional::python_round(static_cast<double>(cw) / ratio.first);
  } else if (in_ratio > ratio.second) {
    cw = functional::python_round(static_cast<double>(ch) * ratio.second);
  }
  return {(h - ch) / 2, (w - cw) / 2, ch, cw};
}

torch::Tensor RandomResizedCrop::apply(const torch::Tensor& image, SampleRandom& random) const {
  functional::check_image(image, "RandomResizedCrop");
  const CropParams p = params(image.size(0), image.size(1), scale_, ratio_, random);
  return functional::resized_crop(image, p.top, p.left, p.height, p.width, height_, width_);
}

std::string RandomResizedCrop::str() const {
  std::string s = "RandomResizedCrop(" + format_hw(height_, width_);
  if (scale_ != std::pair{0.08, 1.0}) s += ", scale=" + format_floats({scale_.first, scale_.second});
  if (ratio_ != std::pair{3.0 / 4.0, 4.0 / 3.0}) s += ", ratio=" + format_floats({ratio_.first, ratio_.second});
  if (antialias_) s += std::string(", antialias=") + (*antialias_ ? "True" : "False");
  return s + ")";
}

std::optional<std::vector<std::shared_ptr<const Transform>>> RandomResizedCrop::for_evaluation() const {
  const std::vector<int64_t> size = height_ == width_ ? std::vector<int64_t>{height_} : std::vector<int64_t>{height_, width_};
  return std::vector<std::shared_ptr<const Transform>>{std::make_shared<Resize>(size),
                                                      std::make_shared<CenterCrop>(height_, width_)};
}

RandomCrop::RandomCrop(int64_t height, int64_t width, std::vector<int64_t> padding, bool pad_if_needed,
                       std::vector<int64_t> fill, std::string padding_mode)
    : height_(height),
      width_(width),
      padding_(std::move(padding)),
      pad_if_needed_(pad_if_needed),
      fill_(std::move(fill)),
      padding_mode_(std::move(padding_mode)) {
  TORCH_CHECK_VALUE(height > 0 && width > 0, "RandomCrop: size must be positive, got (", height, ", ", width, ")");
  TORCH_CHECK_VALUE(padding_.empty() || padding_.size() == 1 || padding_.size() == 2 || padding_.size() == 4,
                    "RandomCrop: padding must be an int or a 2 or 4 element tuple, got ", format_ints(padding_));
  for (int64_t p : padding_)
    TORCH_CHECK_VALUE(p >= 0, "RandomCrop: padding must not be negative, got ", format_ints(padding_));
  TORCH_CHECK_VALUE(fill_.size() == 1 || fill_.size() == 3, "RandomCrop: fill must be an int or one per channel, got ",
                    format_ints(fill_));
  for (int64_t f : fill_) TORCH_CHECK_VALUE(0 <= f && f <= 255, "RandomCrop: fill must be in 0..255, got ", format_ints(fill_));
  TORCH_CHECK_VALUE(padding_mode_ == "constant", "RandomCrop: padding_mode '", padding_mode_,
                    "' is not supported; only 'constant' (torchvision's default) is");
}

CropParams RandomCrop::params(int64_t h, int64_t w, int64_t height, int64_t width, SampleRandom& random) {
  TORCH_CHECK(h >= height && w >= width, "RandomCrop: the crop (", height, ", ", width,
              ") is larger than the (padded) image (", h, ", ", w, "); pass padding or pad_if_needed=True");
  if (h == height && w == width) return {0, 0, h, w};
  const int64_t top = random.integer(0, h - height);
  const int64_t left = random.integer(0, w - width);
  return {top, left, height, width};
}

torch::Tensor RandomCrop::apply(const torch::Tensor& image, SampleRandom& random) const {
  functional::check_image(image, "RandomCrop");
  torch::Tensor padded = image;
  if (!padding_.empty()) {
    const auto& p = padding_;
    const size_t n = p.size();
    padded = functional::pad(padded, p[0], p[n == 4 ? 1 : n - 1], p[n == 4 ? 2 : 0], p[n - 1], fill_);
  }
  // torchvision pads both sides by the shortfall.
  if (pad_if_needed_ && padded.size(1) < width_) {
    const int64_t d = width_ - padded.size(1);
    padded = functional::pad(padded, d, 0, d, 0, fill_);
  }
  if (pad_if_needed_ && padded.size(0) < height_) {
    const int64_t d = height_ - padded.size(0);
    padded = functional::pad(padded, 0, d, 0, d, fill_);
  }
  const CropParams p = params(padded.size(0), padded.size(1), height_, width_, random);
  return functional::crop(padded, p.top, p.left, p.height, p.width);
}

std::string RandomCrop::str() const {
  std::string s = "RandomCrop(" + format_hw(height_, width_);
  if (!padding_.empty()) s += ", padding=" + format_size(padding_);
  if (pad_if_needed_) s += ", pad_if_needed=True";
  if (fill_ != std::vector<int64_t>{0}) s += ", fill=" + format_size(fill_);
  return s + ")";
}

std::optional<std::vector<std::shared_ptr<const Transform>>> RandomCrop::for_evaluation() const {
  return std::vector<std::shared_ptr<const Transform>>{std::make_shared<CenterCrop>(height_, width_)};
}

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  TORCH_CHECK_VALUE(0 <= p && p <= 1, "RandomHorizontalFlip: p must be in [0, 1], got ", p);
}

torch::Tensor RandomHorizontalFlip::apply(const torch::Tensor& image, SampleRandom& random) const {
  return random.uniform() < p_ ? functional::hflip(image) : image;
}

std::string RandomHorizontalFlip::str() const {
  return p_ == 0.5 ? "RandomHorizontalFlip()" : "RandomHorizontalFlip(p=" + format_float(p_) + ")";
}

Grayscale::Grayscale(int64_t num_output_channels) : num_output_channels_(num_output_channels) {
  TORCH_CHECK_VALUE(num_output_channels == 1 || num_output_channels == 3,
                    "Grayscale: num_output_channels must be 1 or 3, got ", num_output_channels);
}

torch::Tensor Grayscale::apply(const torch::Tensor& image, SampleRandom&) const {
  return functional::to_grayscale(image, num_output_channels_);
}

std::string Grayscale::str() const {
  return num_output_channels_ == 1 ? "Grayscale()" : "Grayscale(num_output_channels=3)";
}

torch::Tensor ToTensor::apply(const torch::Tensor& image, SampleRandom&) const { return functional::to_tensor(image); }

Normalize::Normalize(std::vector<double> mean, std::vector<double> std_dev)
    : mean_(std::move(mean)), std_(std::move(std_dev)) {
  TORCH_CHECK_VALUE(!mean_.empty() && mean_.size() == std_.size(), "Normalize: mean ", format_floats(mean_), " and std ",
                    format_floats(std_), " must have the same, non-zero length");
  for (double s : std_)
    TORCH_CHECK_VALUE(static_cast<float>(s) != 0.0f, "Normalize: std ", format_floats(std_),
                      " is zero (in float32) for a channel, leading to division by zero");
}

torch::Tensor Normalize::apply(const torch::Tensor& image, SampleRandom&) const {
  TORCH_CHECK(image.dim() == 3 && image.scalar_type() == torch::kFloat,
              "Normalize: expected a float (C, H, W) tensor (after ToTensor), got ", image.scalar_type(), " ",
              image.sizes());
  const auto channels = static_cast<size_t>(image.size(0));
  TORCH_CHECK(mean_.size() == 1 || mean_.size() == channels, "Normalize: mean ", format_floats(mean_), " has ",
              mean_.size(), " values for an image of ", channels, " channels");
  // torchvision's arithmetic: float32 mean and std, subtract, then divide.
  const auto mean = torch::tensor(mean_, torch::kDouble).to(torch::kFloat).view({-1, 1, 1});
  const auto std_dev = torch::tensor(std_, torch::kDouble).to(torch::kFloat).view({-1, 1, 1});
  return image.sub(mean).div(std_dev);
}

std::string Normalize::str() const {
  return "Normalize(mean=" + format_floats(mean_) + ", std=" + format_floats(std_) + ")";
}

// --- the pipeline ------------------------------------------------------------------------------

torch::Tensor Transforms::operator()(const torch::Tensor& image, SampleRandom& random) const {
  torch::Tensor x = image;
  for (const auto& step : steps_) x = step->apply(x, random);
  return x.scalar_type() == torch::kUInt8 ? functional::to_tensor(x) : x;
}

Transforms Transforms::for_evaluation() const {
  Transforms out;
  for (const auto& step : steps_) {
    const auto counterpart = step->for_evaluation();
    if (!counterpart) out.steps_.push_back(step);
    else out.steps_.insert(out.steps_.end(), counterpart->begin(), counterpart->end());
  }
  return out;
}

bool Transforms::random() const {
  return std::any_of(steps_.begin(), steps_.end(), [](const auto& step) { return step->random(); });
}

std::string Transforms::str() const {
  std::string s = "Compose(";
  bool converted = false;
  for (size_t i = 0; i < steps_.size(); ++i) {
    s += (i > 0 ? ", " : "") + steps_[i]->str();
    converted = converted || steps_[i]->stage() == TransformStage::kToTensor;
  }
  if (!converted) s += steps_.empty() ? "ToTensor()" : ", ToTensor()";
  return s + ")";
}

}  // namespace lockstep::data
