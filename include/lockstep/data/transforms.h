#pragma once
// torchvision's image transforms, by their names and with their semantics, applied to one sample
// at a time with randomness that depends only on (seed, epoch, sample index).

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::data {

// The random numbers of one sample's transforms in one epoch: a generator seeded from
// (seed, epoch, index) alone, so a sample is transformed the same way whichever worker thread,
// rank or world size loads it, and a resumed run repeats it.
class SampleRandom {
 public:
  SampleRandom(uint64_t seed, int64_t epoch, int64_t index);
  double uniform();                            // in [0, 1)
  int64_t integer(int64_t low, int64_t high);  // in [low, high], both included

 private:
  uint64_t state_[4];
};

// Where a step sits in a pipeline: on the uint8 image, the conversion, or on the float tensor.
enum class TransformStage { kImage, kToTensor, kTensor };

// One step of a pipeline. An image before ToTensor is uint8 (H, W, C) as PIL holds it; after it,
// float (C, H, W) in [0, 1].
class Transform {
 public:
  virtual ~Transform() = default;
  virtual torch::Tensor apply(const torch::Tensor& image, SampleRandom& random) const = 0;
  // As the spec spells it, with every argument, e.g. "RandomCrop(28, padding=4)".
  virtual std::string str() const = 0;
  virtual bool random() const { return false; }
  virtual TransformStage stage() const { return TransformStage::kImage; }
  // What stands for this step on held-out images (Transforms::for_evaluation); nullopt: the step
  // itself.
  virtual std::optional<std::vector<std::shared_ptr<const Transform>>> for_evaluation() const { return std::nullopt; }
};

// torchvision.transforms.functional on the PIL path, for uint8 (H, W, C) images with C 1 or 3.
namespace functional {
// PIL's bilinear resize (antialiased when shrinking), to (height, width, C).
// See Note [PIL's fixed-point resampling].
torch::Tensor resize(const torch::Tensor& image, int64_t height, int64_t width);
// The (height, width) Resize(size, max_size) makes of an (h, w) image: `size` is {edge} for the
// smaller edge, or {height, width}.
std::pair<int64_t, int64_t> resized_size(int64_t h, int64_t w, const std::vector<int64_t>& size,
                                         std::optional<int64_t> max_size);
// Rows [top, top + height) and columns [left, left + width), zero where they leave the image (as
// PIL's crop).
torch::Tensor crop(const torch::Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width);
torch::Tensor resized_crop(const torch::Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width,
                           int64_t out_height, int64_t out_width);
torch::Tensor center_crop(const torch::Tensor& image, int64_t height, int64_t width);
// Constant padding; `fill` is one value or one per channel.
torch::Tensor pad(const torch::Tensor& image, int64_t left, int64_t top, int64_t right, int64_t bottom,
                  const std::vector<int64_t>& fill);
torch::Tensor hflip(const torch::Tensor& image);
// PIL's convert("L") (ITU-R 601-2 luma in 16-bit fixed point), repeated to 3 channels if asked.
torch::Tensor to_grayscale(const torch::Tensor& image, int64_t num_output_channels);
// uint8 (H, W, C) to float (C, H, W) / 255.
torch::Tensor to_tensor(const torch::Tensor& image);
}  // namespace functional

// A crop's rows [top, top + height) and columns [left, left + width).
struct CropParams {
  int64_t top = 0, left = 0, height = 0, width = 0;
};

class Resize : public Transform {
 public:
  // size {edge}: the smaller edge becomes `edge`, the other int(edge * long / short); {h, w}:
  // exactly that. Bilinear only; antialias is ignored, as torchvision ignores it for PIL images.
  explicit Resize(std::vector<int64_t> size, std::optional<int64_t> max_size = std::nullopt,
                  std::optional<bool> antialias = std::nullopt);
  torch::Tensor apply(const torch::Tensor& image, SampleRandom& random) const override;
  std::string str() const override;

 private:
  std::vector<int64_t> size_;
  std::optional<int64_t> max_size_;
  std::optional<bool> antialias_;
};

class CenterCrop : public Transform {
 public:
  CenterCrop(int64_t height, int64_t width);
  torch::Tensor apply(const torch::Tensor& image, SampleRandom& random) const override;
  std::string str() const override;

 private:
  int64_t height_, width_;
};

class RandomResizedCrop : public Transform {
 public:
  RandomResizedCrop(int64_t height, int64_t width, std::pair<double, double> scale = {0.08, 1.0},
                    std::pair<double, double> ratio = {3.0 / 4.0, 4.0 / 3.0}, std::optional<bool> antialias = std::nullopt);
  // torchvision's get_params for an (h, w) image: 10 tries of an area fraction in `scale` and a
  // log-uniform aspect ratio in `ratio`, then the largest central crop within `ratio`.
  static CropParams params(int64_t h, int64_t w, std::pair<double, double> scale, std::pair<double, double> ratio,
                           SampleRandom& random);
  torch::Tensor apply(const torch::Tensor& image, SampleRandom& random) const override;
  std::string str() const override;
  bool random() const override { return true; }
  std::optional<std::vector<std::shared_ptr<const Transform>>> for_evaluation() const override;

 private:
  int64_t height_, width_;
  std::pair<double, double> scale_, ratio_;
  std::optional<bool> antialias_;
};

class RandomCrop : public Transform {
 public:
  // padding: {} none, {all}, {left/right, top/bottom} or {left, top, right, bottom}; fill: one
  // value or one per channel. Only padding_mode "constant".
  RandomCrop(int64_t height, int64_t width, std::vector<int64_t> padding = {}, bool pad_if_needed = false,
             std::vector<int64_t> fill = {0}, std::string padding_mode = "constant");
  // torchvision's get_params: a uniform position of an (height, width) crop in an (h, w) image.
  static CropParams params(int64_t h, int64_t w, int64_t height, int64_t width, SampleRandom& random);
  torch::Tensor apply(const torch::Tensor& image, SampleRandom& random) const override;
  std::string str() const override;
  bool random() const override { return true; }
  std::optional<std::vector<std::shared_ptr<const Transform>>> for_evaluation() const override;

 private:
  int64_t height_, width_;
  std::vector<int64_t> padding_;
  bool pad_if_needed_;
  std::vector<int64_t> fill_;
  std::string padding_mode_;
};

class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  torch::Tensor apply(const torch::Tensor& image, SampleRandom& random) const override;
  std::string str() const override;
  bool random() const override { return true; }
  std::optional<std::vector<std::shared_ptr<const Transform>>> for_evaluation() const override {
    return std::vector<std::shared_ptr<const Transform>>{};  // nothing: held-out images are not flipped
  }

 private:
  double p_;
};

class Grayscale : public Transform {
 public:
  explicit Grayscale(int64_t num_output_channels = 1);
  torch::Tensor apply(const torch::Tensor& image, SampleRandom& random) const override;
  std::string str() const override;

 private:
  int64_t num_output_channels_;
};

class ToTensor : public Transform {
 public:
  torch::Tensor apply(const torch::Tensor& image, SampleRandom& random) const override;
  std::string str() const override { return "ToTensor()"; }
  TransformStage stage() const override { return TransformStage::kToTensor; }
};

class Normalize : public Transform {
 public:
  // One mean and std per channel, or one of each for every channel (broadcast, as torchvision).
  Normalize(std::vector<double> mean, std::vector<double> std_dev);
  torch::Tensor apply(const torch::Tensor& image, SampleRandom& random) const override;
  std::string str() const override;
  TransformStage stage() const override { return TransformStage::kTensor; }

 private:
  std::vector<double> mean_, std_;
};

// torchvision.transforms.Compose of transforms parsed from a spec written as in Python, separated
// by commas or semicolons at the top level, e.g.
//   "Resize(32), CenterCrop(28), RandomHorizontalFlip(), ToTensor(), Normalize((0.5,), (0.5,))"
// Known: Resize, CenterCrop, RandomResizedCrop, RandomCrop, RandomHorizontalFlip, Grayscale,
// ToTensor, Normalize, with torchvision's argument names, positions and defaults. A pipeline that
// ends before ToTensor gets ToTensor's conversion at the end.
class Transforms {
 public:
  Transforms() = default;  // ToTensor() alone
  // Throws c10::ValueError naming the spec, the position and what is known, for anything else.
  static Transforms parse(const std::string& spec);

  // uint8 (H, W, C) in, float (C, H, W) out.
  torch::Tensor operator()(const torch::Tensor& image, SampleRandom& random) const;

  // The pipeline for held-out images: each random step replaced by its deterministic
  // counterpart, as torchvision's reference scripts pair them: RandomResizedCrop(s) by Resize(s),
  // CenterCrop(s); RandomCrop(s, ...) by CenterCrop(s); RandomHorizontalFlip by nothing.
  Transforms for_evaluation() const;

  bool random() const;       // any step draws random numbers
  std::string str() const;   // "Compose(...)" as parsed, canonical
  const std::vector<std::shared_ptr<const Transform>>& steps() const { return steps_; }

 private:
  std::vector<std::shared_ptr<const Transform>> steps_;
};

}  // namespace lockstep::data
