#pragma once

#include <torch/arg.h>
#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

namespace lockstep::data {

enum class Split { kTrain, kTest };

// An in-memory image classification dataset. Images stay uint8 in memory (a quarter of float's
// size) and become normalised float only per batch.
struct Dataset {
  torch::Tensor images;  // uint8 (N, C, H, W)
  torch::Tensor labels;  // int64 (N), each in [0, num_classes)
  int64_t num_classes = 0;
  double mean = 0.0;     // normalisation on the [0, 1] scale: x = (pixel / 255 - mean) / stddev
  double stddev = 1.0;

  int64_t size() const { return labels.size(0); }

  // The first `n` samples (all of them when n <= 0 or n >= size()); shares memory.
  Dataset take(int64_t n) const;

  // Samples `indices` (int64, shape (B)) as a normalised float batch: images (B, C, H, W), labels (B).
  std::pair<torch::Tensor, torch::Tensor> batch(const torch::Tensor& indices) const;
};

// Fashion-MNIST (or MNIST) from a directory holding the four IDX files as distributed:
// {train,t10k}-{images-idx3,labels-idx1}-ubyte, each gzipped (.gz) or not.
// Throws c10::Error naming the path and the fix when the directory or a file is missing or
// malformed, or when image and label counts disagree.
Dataset load_fashion_mnist(const std::string& dir, Split split);

constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Seeded random images and labels, for throughput runs of models whose data we do not ship.
struct SyntheticOptions {
  TORCH_ARG(std::vector<int64_t>, shape) = {1, 28, 28};  // (C, H, W) of one image
  TORCH_ARG(int64_t, num_classes) = 10;
  TORCH_ARG(int64_t, size) = 10000;                      // number of samples
  TORCH_ARG(uint64_t, seed) = 0;
};
Dataset make_synthetic(const SyntheticOptions& options);

}  // namespace lockstep::data
