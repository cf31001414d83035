#include "lockstep/data/dataset.h"

#include <ATen/CPUGeneratorImpl.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include "lockstep/data/idx.h"

namespace lockstep::data {
namespace {

// Fashion-MNIST's per-pixel mean and standard deviation over the training split, on [0, 1].
constexpr double kFashionMnistMean = 0.2860;
constexpr double kFashionMnistStd = 0.3530;

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The distributed file name, preferring the gzipped copy.
std::string idx_path(const std::string& dir, const std::string& stem) {
  std::string gz = dir + "/" + stem + ".gz";
  return exists(gz) || !exists(dir + "/" + stem) ? gz : dir + "/" + stem;
}

}  // namespace

Dataset Dataset::take(int64_t n) const {
  if (n <= 0 || n >= size()) return *this;
  Dataset out = *this;
  out.images = images.narrow(0, 0, n);
  out.labels = labels.narrow(0, 0, n);
  return out;
}

std::pair<torch::Tensor, torch::Tensor> Dataset::batch(const torch::Tensor& indices) const {
  torch::Tensor x = images.index_select(0, indices).to(torch::kFloat32);
  // One fused pass: (p / 255 - mean) / stddev == p * a + b.
  const double a = 1.0 / (255.0 * stddev);
  x.mul_(a).add_(-mean / stddev);
  return {x, labels.index_select(0, indices)};
}

Dataset load_fashion_mnist(const std::string& dir, Split split) {
  struct stat st {};
  TORCH_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "data directory '", dir,
              "' not found (install the data with: apt-get install dataset-fashion-mnist, "
              "or pass --data-dir DIR)");
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_path = idx_path(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = idx_path(dir, prefix + "-labels-idx1-ubyte");

  Dataset ds;
  ds.images = read_idx(images_path);
  torch::Tensor labels = read_idx(labels_path);
  TORCH_CHECK(ds.images.dim() == 4, "IDX file '", images_path,
              "' holds labels, not images (expected magic number 2051)");
  TORCH_CHECK(labels.dim() == 1, "IDX file '", labels_path,
              "' holds images, not labels (expected magic number 2049)");
  TORCH_CHECK(ds.images.size(0) == labels.size(0), "image/label count mismatch: '", images_path,
              "' holds ", ds.images.size(0), " images but '", labels_path, "' holds ",
              labels.size(0), " labels");
  ds.labels = labels.to(torch::kInt64);
  ds.num_classes = 10;
  const int64_t max_label = ds.labels.numel() ? ds.labels.max().item<int64_t>() : 0;
  TORCH_CHECK(max_label < ds.num_classes, "IDX file '", labels_path, "' holds label ", max_label,
              "; expected labels in [0, ", ds.num_classes, ")");
  ds.mean = kFashionMnistMean;
  ds.stddev = kFashionMnistStd;
  return ds;
}

Dataset make_synthetic(const SyntheticOptions& options) {
  TORCH_CHECK_VALUE(options.shape().size() == 3, "synthetic image shape must be (C, H, W), got ",
                    options.shape().size(), " dimensions");
  for (int64_t d : options.shape())
    TORCH_CHECK_VALUE(d > 0, "synthetic image shape has a dimension of ", d, "; all must be > 0");
  TORCH_CHECK_VALUE(options.num_classes() >= 2, "synthetic num_classes=", options.num_classes(),
                    " must be at least 2");
  TORCH_CHECK_VALUE(options.size() >= 1, "synthetic size=", options.size(), " must be at least 1");

  auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed());
  std::vector<int64_t> shape{options.size()};
  shape.insert(shape.end(), options.shape().begin(), options.shape().end());
  Dataset ds;
  ds.images = torch::randint(0, 256, shape, gen, torch::kUInt8);
  ds.labels = torch::randint(0, options.num_classes(), {options.size()}, gen, torch::kInt64);
  ds.num_classes = options.num_classes();
  ds.mean = 0.5;   // uniform bytes: mean 127.5 / 255, standard deviation ~ 0.289
  ds.stddev = 0.289;
  return ds;
}

}  // namespace lockstep::data
