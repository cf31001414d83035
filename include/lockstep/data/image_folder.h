#pragma once
// torchvision.datasets.ImageFolder's layout: root/<class>/.../<image>.

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/data/dataset.h"

namespace lockstep::data {

// The extensions torchvision's ImageFolder takes (IMG_EXTENSIONS), matched case-insensitively.
// Of these lockstep decodes JPEG and PNG (see image.h).
const std::vector<std::string>& image_extensions();

// The files of an ImageFolder tree, in torchvision's order and with its class indices: classes
// are the sub-directories of `root` (symbolic links followed) sorted by name, index = position;
// samples are each class's files with an image extension, found recursively (directories in
// sorted path order, files sorted within each), class by class. Holds paths only: images are read
// when a sample is loaded.
class ImageFolder {
 public:
  // Throws c10::ValueError naming `root` when it is not a directory, has no class
  // sub-directories, or a class has no image file (torchvision's FileNotFoundError cases).
  explicit ImageFolder(std::string root);

  int64_t size() const { return static_cast<int64_t>(targets_.size()); }
  const std::string& root() const { return root_; }
  const std::vector<std::string>& classes() const { return classes_; }
  int64_t target(int64_t index) const { return targets_.at(index); }
  // root/<class>/.../<file>
  std::string path(int64_t index) const;
  // Samples whose extension lockstep does not decode (.bmp, .tif, ...), in sample order.
  std::vector<int64_t> undecodable() const;
  // Directories reached again through a symbolic link and skipped, relative to root (see Note
  // [Walking an image folder]).
  const std::vector<std::string>& repeated_directories() const { return repeated_; }

 private:
  std::string root_;
  std::vector<std::string> classes_;
  std::vector<std::string> files_;  // relative to root_
  std::vector<int64_t> targets_;
  std::vector<std::string> repeated_;
};

// An in-memory data set written out as an ImageFolder tree of PNG files: root/<class>/<i>.png,
// the classes its labels zero-padded to one width ("0" .. "9"), so that their sorted order is the
// labels' order and ImageFolder(root) gives every image its label back. Grey for one channel, RGB
// for three. Returns the number of files written.
int64_t write_image_folder(const Dataset& dataset, const std::string& root);

}  // namespace lockstep::data
