#include "lockstep/train/image_folder_data.h"

#include <torch/torch.h>

#include <c10/util/StringUtil.h>

#include <numeric>

#include "lockstep/data/image.h"

namespace lockstep::train {

ImageFolderData::ImageFolderData(std::shared_ptr<const data::ImageFolder> folder, ImageFolderDataOptions options,
                                 std::vector<int64_t> indices)
    : folder_(std::move(folder)), options_(std::move(options)), indices_(std::move(indices)) {
  TORCH_CHECK_VALUE(folder_ != nullptr, "ImageFolderData: no image folder");
  if (indices_.empty()) {
    indices_.resize(folder_->size());
    std::iota(indices_.begin(), indices_.end(), 0);
  }
  for (int64_t i : indices_)
    TORCH_CHECK_INDEX(i >= 0 && i < folder_->size(), "ImageFolderData: sample ", i, " is not in image folder '",
                      folder_->root(), "' (", folder_->size(), " images)");
}

Example ImageFolderData::get(int64_t index) const {
  TORCH_CHECK_INDEX(index >= 0 && index < size(), "sample ", index, " is out of range [0, ", size(), ")");
  const int64_t i = indices_[index];
  return transform(i, data::read_image(folder_->path(i)));
}

Example ImageFolderData::transform(int64_t i, const torch::Tensor& image) const {
  data::SampleRandom random(seed_, epoch_, i);
  return {options_.transforms()(image, random), torch::tensor(folder_->target(i), torch::kInt64)};
}

Example ImageFolderData::get_batch(const std::vector<int64_t>& indices) const {
  std::vector<Example> samples;
  std::vector<int64_t> read;  // the folder's index of each sample
  std::string skipped;
  for (int64_t index : indices) {
    TORCH_CHECK_INDEX(index >= 0 && index < size(), "sample ", index, " is out of range [0, ", size(), ")");
    const int64_t i = indices_[index];
    torch::Tensor image;
    if (!options_.skip_bad_samples()) {
      image = data::read_image(folder_->path(i));
    } else {
      try {  // only reading and decoding: a transform that fails fails for every file
        image = data::read_image(folder_->path(i));
      } catch (const c10::Error& e) {
        skipped = folder_->path(i);
        std::lock_guard<std::mutex> lock(bad_mutex_);
        if (bad_.insert(i).second)
          report(options_.reporter(), ReportKind::kWarning,
                 c10::str("skipping ", e.what_without_backtrace(), " (", bad_.size(), " skipped so far)"));
        continue;
      }
    }
    samples.push_back(transform(i, image));
    read.push_back(i);
  }
  TORCH_CHECK(!samples.empty() || indices.empty(), "none of the ", indices.size(),
              " images of a batch could be read, e.g. '", skipped,
              "'; skip_bad_samples leaves out single files, not whole batches: check the folder");
  // Stacking needs one shape; say which files differ and how to make them agree.
  for (size_t k = 1; k < samples.size(); ++k)
    TORCH_CHECK_VALUE(samples[k].data.sizes() == samples[0].data.sizes(),
                      "images of one batch differ in shape after the transforms: '", folder_->path(read[0]),
                      "' gives ", samples[0].data.sizes(), " and '", folder_->path(read[k]), "' gives ",
                      samples[k].data.sizes(), "; a batch stacks images of one shape, so make them agree: add ",
                      "Resize((H, W)) or CenterCrop(size) before ToTensor() to the transforms");
  return collate(std::move(samples));
}

void ImageFolderData::set_epoch(int64_t epoch, uint64_t seed) {
  epoch_ = epoch;
  seed_ = seed;
}

std::vector<std::pair<std::string, double>> ImageFolderData::figures() const {
  if (!options_.skip_bad_samples()) return {};
  std::lock_guard<std::mutex> lock(bad_mutex_);
  return {{"bad_samples", static_cast<double>(bad_.size())}};
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> holdout_split(int64_t n, double fraction, uint64_t seed) {
  TORCH_CHECK_VALUE(fraction > 0.0 && fraction < 1.0, "a held-out fraction of ", fraction,
                    " is not in (0, 1); e.g. 0.1 holds out a tenth of the samples");
  const auto held = static_cast<int64_t>(static_cast<double>(n) * fraction);
  TORCH_CHECK_VALUE(held >= 1 && held < n, "holding out ", fraction, " of ", n, " samples leaves ", held,
                    " held out and ", n - held, " to train on; both need at least one");
  const torch::Tensor order = torch::randperm(n, torch::make_generator<at::CPUGeneratorImpl>(seed), torch::kInt64);
  const int64_t* p = order.data_ptr<int64_t>();
  std::vector<int64_t> train(p, p + n - held), test(p + n - held, p + n);
  std::sort(train.begin(), train.end());
  std::sort(test.begin(), test.end());
  return {std::move(train), std::move(test)};
}

}  // namespace lockstep::train
