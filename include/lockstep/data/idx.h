#pragma once

#include <torch/types.h>

#include <string>

namespace lockstep::data {

// Reads an IDX file of unsigned bytes (the MNIST / Fashion-MNIST format), gzipped or not.
// Images (magic 2051) come back as uint8 (N, 1, rows, cols); labels (magic 2049) as uint8 (N).
// Throws c10::Error naming the path for a missing file, a wrong magic number or a truncated file.
torch::Tensor read_idx(const std::string& path);

}  // namespace lockstep::data
