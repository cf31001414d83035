#include "lockstep/data/image_folder.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>

#include "lockstep/data/image.h"

namespace lockstep::data {
namespace {

namespace fs = std::filesystem;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool has_extension(const std::string& name, const std::vector<std::string>& extensions) {
  const std::string l = lower(name);
  return std::any_of(extensions.begin(), extensions.end(), [&](const std::string& e) { return ends_with(l, e); });
}

// Note [Walking an image folder]
// The files under a class directory as torchvision's make_dataset lists them: sorted(os.walk(dir,
// followlinks=True)) orders the directories by path, and each directory's files are sorted.
// Symbolic links to directories are followed, as there, but within a class a directory (its device
// and inode) is visited once: os.walk follows a link to "." or to a parent until the path is too
// long, which with two such links is 2^40 paths. (A class that is a link to another class's
// directory is listed under both names, as torchvision does.) A directory met again is skipped and listed in
// ImageFolder::repeated_directories(), so a caller can say so. The walk keeps its own stack of
// directories to visit, so a deep tree takes heap, not call stack.
using Visited = std::set<std::pair<dev_t, ino_t>>;

void walk(const fs::path& root, const fs::path& top, Visited& visited,
          std::vector<std::pair<std::string, std::vector<std::string>>>& out, std::vector<std::string>& repeated) {
  std::vector<fs::path> pending{top};
  while (!pending.empty()) {
    const fs::path dir = std::move(pending.back());
    pending.pop_back();
    struct stat st {};
    TORCH_CHECK(::stat(dir.c_str(), &st) == 0, "cannot list the image folder directory '", dir.string(), "': ",
                std::strerror(errno));
    if (!visited.emplace(st.st_dev, st.st_ino).second) {
      repeated.push_back(dir.lexically_relative(root).string());
      continue;
    }
    std::vector<std::string> files;
    std::vector<fs::path> dirs;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code type_ec;
      if (it->is_directory(type_ec)) dirs.push_back(it->path());
      else files.push_back(it->path().filename().string());
    }
    TORCH_CHECK(!ec, "cannot list the image folder directory '", dir.string(), "': ", ec.message());
    std::sort(files.begin(), files.end());
    out.emplace_back(dir.lexically_relative(root).string(), std::move(files));
    std::sort(dirs.begin(), dirs.end());
    pending.insert(pending.end(), dirs.rbegin(), dirs.rend());  // the first sorted directory next
  }
}

}  // namespace

const std::vector<std::string>& image_extensions() {
  static const std::vector<std::string> extensions{".jpg", ".jpeg", ".png", ".ppm", ".bmp",
                                                   ".pgm", ".tif",  ".tiff", ".webp"};
  return extensions;
}

ImageFolder::ImageFolder(std::string root) : root_(std::move(root)) {
  std::error_code ec;
  TORCH_CHECK_VALUE(fs::is_directory(root_, ec), "image folder '", root_, "' is not a directory; give a directory ",
                    "with one sub-directory of images per class (torchvision's ImageFolder layout)");
  for (fs::directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_directory(type_ec)) classes_.push_back(it->path().filename().string());
  }
  TORCH_CHECK_VALUE(!ec, "cannot list image folder '", root_, "': ", ec.message());
  TORCH_CHECK_VALUE(!classes_.empty(), "image folder '", root_, "' has no class sub-directories; put each class's ",
                    "images in a directory of its own: ", root_, "/<class>/<image>.png");
  std::sort(classes_.begin(), classes_.end());
  std::vector<std::string> empty;
  for (size_t c = 0; c < classes_.size(); ++c) {
    std::vector<std::pair<std::string, std::vector<std::string>>> dirs;
    Visited visited;  // per class: two classes may be one directory (a link), as torchvision lists them
    walk(root_, fs::path(root_) / classes_[c], visited, dirs, repeated_);
    std::sort(dirs.begin(), dirs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const size_t before = files_.size();
    for (const auto& [dir, names] : dirs)
      for (const std::string& name : names)
        if (has_extension(name, image_extensions())) {
          files_.push_back((fs::path(dir) / name).string());
          targets_.push_back(static_cast<int64_t>(c));
        }
    if (files_.size() == before) empty.push_back(classes_[c]);
  }
  TORCH_CHECK_VALUE(empty.empty(), "image folder '", root_, "': no image file for the classes ", c10::Join(", ", empty),
                    " (the extensions taken are ", c10::Join(" ", image_extensions()), ")");
}

std::string ImageFolder::path(int64_t index) const { return (fs::path(root_) / files_.at(index)).string(); }

std::vector<int64_t> ImageFolder::undecodable() const {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < size(); ++i)
    if (!has_extension(files_[i], {".jpg", ".jpeg", ".png"})) out.push_back(i);
  return out;
}

int64_t write_image_folder(const Dataset& dataset, const std::string& root) {
  const int64_t classes = std::max<int64_t>(dataset.num_classes, 1);
  const auto width = std::to_string(classes - 1).size();
  auto padded = [](int64_t v, size_t w) {
    std::string s = std::to_string(v);
    return std::string(w - std::min(w, s.size()), '0') + s;
  };
  const auto digits = std::to_string(std::max<int64_t>(dataset.size() - 1, 0)).size();
  for (int64_t c = 0; c < classes; ++c) fs::create_directories(fs::path(root) / padded(c, width));
  const auto labels = dataset.labels.contiguous();
  for (int64_t i = 0; i < dataset.size(); ++i) {
    const int64_t label = labels[i].item<int64_t>();
    write_png((fs::path(root) / padded(label, width) / (padded(i, digits) + ".png")).string(),
              dataset.images[i].permute({1, 2, 0}));  // (C, H, W) -> (H, W, C)
  }
  return dataset.size();
}

}  // namespace lockstep::data
