#pragma once
// torchvision's image transforms, by their names and with their semantics, applied to one sample
// at a time with randomness that depends only on (seed, epoch, sample index).

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
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

// One step of a pipeline. An image before ToTensor is uint8 (H, W, C) as PIL holds it; after it,
// float (C, H, W) in [0, 1].
class Transform {
 public:
  virtual ~Transform() = default;
  virtual torch::Tensor apply(const torch::Tensor& image, SampleRandom& random) const = 0;
  // As the spec spells it, with every argument, e.g. "RandomCrop(28, padding=4)".
  virtual std::string str() const = 0;
  virtual bool random() const { return false; }
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

  bool random() const;       // any step draws random numbers
  std::string str() const;   // "Compose(...)" as parsed, canonical
  const std::vector<std::shared_ptr<const Transform>>& steps() const { return steps_; }

 private:
  std::vector<std::shared_ptr<const Transform>> steps_;
};

}  // namespace lockstep::data
