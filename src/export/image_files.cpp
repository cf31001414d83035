#include "lockstep/export/image_files.h"

#include <torch/torch.h>

#include <functional>
#include <numeric>

#include "lockstep/core/atomic_file.h"
#include "lockstep/data/idx.h"

namespace lockstep::exporting {
namespace {

bool is_idx(const std::string& path, const std::vector<char>& bytes) {
  const bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  // IDX magic: two zero bytes, 0x08 (unsigned byte data), then the number of dimensions.
  return gz || (bytes.size() >= 4 && bytes[0] == 0 && bytes[1] == 0 && bytes[2] == 0x08);
}

torch::Tensor read_bytes(const std::string& path) {  // (N) uint8 or an IDX tensor
  std::vector<char> bytes = read_file(path);
  if (is_idx(path, bytes)) return data::read_idx(path);
  return torch::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, torch::kUInt8).clone();
}

}  // namespace

data::Dataset load_image_files(const std::string& images_path, const std::string& labels_path,
                               const std::vector<int64_t>& shape, double mean, double stddev) {
  const int64_t per_image = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  torch::Tensor images = read_bytes(images_path);
  TORCH_CHECK(images.numel() > 0 && images.numel() % per_image == 0, "'", images_path, "' holds ", images.numel(),
              " pixels, not a whole number of images of shape ", c10::IntArrayRef(shape), " (", per_image,
              " bytes each)");
  const int64_t n = images.numel() / per_image;
  if (images.dim() > 1)  // IDX images are (N, 1, rows, cols): their shape must be the model's
    TORCH_CHECK(images.sizes().slice(1).equals(shape), "'", images_path, "' holds images of shape ",
                images.sizes().slice(1), " but the model takes ", c10::IntArrayRef(shape));
  std::vector<int64_t> full{n};
  full.insert(full.end(), shape.begin(), shape.end());
  data::Dataset ds;
  ds.images = images.reshape(full).contiguous();
  ds.mean = mean;
  ds.stddev = stddev;
  if (labels_path.empty()) {
    ds.labels = torch::zeros({n}, torch::kLong);
    return ds;
  }
  const torch::Tensor labels = read_bytes(labels_path).flatten().to(torch::kLong);
  TORCH_CHECK(labels.numel() == n, "'", labels_path, "' holds ", labels.numel(), " labels but '", images_path,
              "' holds ", n, " images");
  ds.labels = labels;
  ds.num_classes = labels.max().item<int64_t>() + 1;
  return ds;
}

}  // namespace lockstep::exporting
