#pragma once
// A training or held-out split read from image files: torchvision's ImageFolder with its
// transforms, as a TrainingData a Trainer (and its background loader) reads.

#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/core/report.h"
#include "lockstep/data/image_folder.h"
#include "lockstep/data/transforms.h"
#include "lockstep/train/training_data.h"

namespace lockstep::train {

struct ImageFolderDataOptions {
  // Applied to every sample as it is loaded; random steps draw from data::SampleRandom(seed,
  // epoch, folder index).
  TORCH_ARG(data::Transforms, transforms);
  // A file that cannot be decoded is left out of its batch with a warning (once per file) and
  // counted in figures() as "bad_samples"; off: it is an error naming the file.
  TORCH_ARG(bool, skip_bad_samples) = false;
  TORCH_ARG(Reporter, reporter) = stdio_reporter();
};

// Samples `indices` of an ImageFolder (all of them when empty), loaded and transformed when a
// batch asks for them, on whichever thread does (get() and get_batch() are thread-safe). data is
// the transforms' output, float (C, H, W); target the class index.
class ImageFolderData : public TrainingData {
 public:
  ImageFolderData(std::shared_ptr<const data::ImageFolder> folder, ImageFolderDataOptions options,
                  std::vector<int64_t> indices = {});

  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  // Throws c10::Error naming the file when it cannot be read or decoded.
  Example get(int64_t index) const override;
  // Skips what cannot be decoded with skip_bad_samples; throws when nothing of the batch is left.
  Example get_batch(const std::vector<int64_t>& indices) const override;
  void set_epoch(int64_t epoch, uint64_t seed) override;
  std::vector<std::pair<std::string, double>> figures() const override;

  const data::ImageFolder& folder() const { return *folder_; }

 private:
  // Folder sample i's image through the transforms, with its class.
  Example transform(int64_t i, const torch::Tensor& image) const;

  std::shared_ptr<const data::ImageFolder> folder_;
  ImageFolderDataOptions options_;
  std::vector<int64_t> indices_;  // into folder_
  int64_t epoch_ = 0;             // set between epochs, while no batch is being built
  uint64_t seed_ = 0;
  mutable std::mutex bad_mutex_;
  mutable std::set<int64_t> bad_;  // folder indices skipped
};

// A seeded split of [0, n) into a training part and a held-out `fraction` of it (rounded down,
// at least 1 sample each): torch.utils.data.random_split of a fixed generator. Throws
// c10::ValueError when the fraction is outside (0, 1) or leaves a part empty.
std::pair<std::vector<int64_t>, std::vector<int64_t>> holdout_split(int64_t n, double fraction, uint64_t seed);

}  // namespace lockstep::train
