#pragma once
// The data loader alone: how many images per second an image folder gives through its transforms
// and the background loader, with no model (what bench/loader_vs_torchvision.sh compares with
// torchvision's DataLoader).

#include <torch/arg.h>

#include <cstdint>
#include <string>

#include "lockstep/train/batch_loader.h"

namespace lockstep::bench {

struct LoaderBenchOptions {
  TORCH_ARG(std::string, data_dir) = "";  // an ImageFolder tree
  TORCH_ARG(std::string, transform) = "";  // torchvision transforms; "": ToTensor()
  TORCH_ARG(int64_t, batch_size) = 64;
  TORCH_ARG(int64_t, epochs) = 1;
  TORCH_ARG(uint64_t, seed) = 0;           // of the shuffle and the random transforms
  TORCH_ARG(train::LoaderOptions, loader);
};

struct LoaderBenchResult {
  int64_t images = 0;      // delivered, over all epochs
  double seconds = 0.0;    // from the first start() to the last batch, scanning the folder excluded
  double images_per_s = 0.0;
  double checksum = 0.0;   // the sum of every batch's pixels: equal for any worker count
};

// Shuffled epochs of the folder (DistributedSampler's order, one replica), every batch taken as
// soon as it is ready. Throws what the folder, the transforms or a file throw.
LoaderBenchResult run_loader_bench(const LoaderBenchOptions& options);

}  // namespace lockstep::bench
