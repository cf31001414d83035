#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/data/dataset.h"

namespace lockstep::exporting {

// Images (and optionally labels) from files, for `lockstep predict`: each file is either an IDX
// file of unsigned bytes (MNIST's format, gzipped or not; recognised by its magic number or a .gz
// name) or raw bytes, one uint8 per pixel in (N, C, H, W) order for images and one per label.
// `shape` is one image's (C, H, W); `mean` and `stddev` the normalisation the model was trained
// with (see data::Dataset); `num_classes` the model's outputs, every label below it. Without
// `labels_path` the labels are all 0 and num_classes is 0. Throws c10::Error naming the file when
// it cannot be read, it is an IDX file of another type than uint8 (floats), its size is not a whole
// number of images, its images have another shape, the label count differs from the image count,
// or a label is not one of the model's classes (naming the first, its index and the range).
data::Dataset load_image_files(const std::string& images_path, const std::string& labels_path,
                               const std::vector<int64_t>& shape, double mean, double stddev, int64_t num_classes);

}  // namespace lockstep::exporting
