#include "lockstep/export/image_files.h"

#include <torch/torch.h>

#include <functional>
#include <numeric>

#include "lockstep/core/atomic_file.h"
#include "lockstep/data/idx.h"

namespace lockstep::exporting {
namespace {

// IDX's type codes (the magic number's third byte) and their element types.
const char* idx_type(char code) {
  switch (static_cast<unsigned char>(code)) {
    case 0x08: return "uint8";
    case 0x09: return "int8";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return nullptr;
  }
}

bool gzipped(const std::string& path) { return path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0; }

// IDX magic: two zero bytes, a type code, then the number of dimensions (1 to 4 here). A gzipped
// file is IDX (read_idx checks its magic inside).
bool is_idx(const std::string& path, const std::vector<char>& bytes) {
  return gzipped(path) || (bytes.size() >= 4 && bytes[0] == 0 && bytes[1] == 0 && idx_type(bytes[2]) != nullptr &&
                bytes[3] >= 1 && bytes[3] <= 4);
}

torch::Tensor read_bytes(const std::string& path) {  // (N) uint8 or an IDX tensor
  std::vector<char> bytes = read_file(path);
  if (is_idx(path, bytes)) {
    TORCH_CHECK(gzipped(path) || bytes[2] == 0x08, "'", path,
                "' is an IDX file of ", idx_type(bytes[2]), " values; images and labels are read as uint8 (pixels ",
                "0 to 255, class indices), as MNIST's files hold them: convert it, or give raw uint8 bytes");
    return data::read_idx(path);
  }
  return torch::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, torch::kUInt8).clone();
}

}  // namespace

data::Dataset load_image_files(const std::string& images_path, const std::string& labels_path,
                               const std::vector<int64_t>& shape, double mean, double stddev, int64_t num_classes) {
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
  const torch::Tensor outside = labels.ge(num_classes).nonzero();
  if (outside.numel() > 0) {
    const int64_t at = outside[0][0].item<int64_t>();
    TORCH_CHECK(false, "'", labels_path, "' holds label ", labels[at].item<int64_t>(), " at index ", at, " (",
                outside.size(0), " label(s) in all) but the model has ", num_classes, " classes (0 to ",
                num_classes - 1, "): are these the labels of these images?");
  }
  ds.labels = labels;
  ds.num_classes = num_classes;
  return ds;
}

}  // namespace lockstep::exporting
