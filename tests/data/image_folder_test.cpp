// ImageFolder's classes and samples against torchvision's for the same tree (written by
// tests/python/image_folders.py), and its refusals.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "../python_script.h"
#include "lockstep/data/image.h"
#include "lockstep/data/image_folder.h"

namespace lockstep::data {
namespace {

using ::testing::HasSubstr;

TEST(ImageFolder, ClassesAndSamplesAreTorchvisionsInTheSameOrder) {
  const testing::PythonFixture made = testing::python_fixture("image_folders.py", "10 0");
  ASSERT_TRUE(made.error.empty()) << made.error;
  const auto theirs = nlohmann::json::parse(testing::read_text(made.dir + "/layout.json"));
  const ImageFolder folder(made.dir + "/layout");
  EXPECT_EQ(folder.classes(), theirs["classes"].get<std::vector<std::string>>());
  ASSERT_EQ(folder.size(), static_cast<int64_t>(theirs["samples"].size()));
  for (int64_t i = 0; i < folder.size(); ++i) {
    EXPECT_EQ(folder.path(i), made.dir + "/layout/" + theirs["samples"][i][0].get<std::string>()) << i;
    EXPECT_EQ(folder.target(i), theirs["samples"][i][1].get<int64_t>()) << i;
  }
  EXPECT_TRUE(folder.undecodable().empty());
}

TEST(ImageFolder, FilesItCannotDecodeAreListed) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir / "cls");
  for (const char* name : {"a.png", "b.bmp", "c.JPEG", "d.tiff"}) std::ofstream(dir / (std::string("cls/") + name)) << "x";
  const ImageFolder folder(dir.path());
  ASSERT_EQ(folder.size(), 4);
  EXPECT_EQ(folder.undecodable(), (std::vector<int64_t>{1, 3}));
}

// Issue 53 item 5: two symbolic links to "." inside a class walked 2^40 paths and never ended.
// Links are followed, but within a class each directory (device and inode) is read once; the
// skipped ones are listed (Note [Walking an image folder]).
TEST(ImageFolder, SymbolicLinksAreFollowedButNoDirectoryIsReadTwice) {
  testing::TempDir dir;
  namespace fs = std::filesystem;
  fs::create_directories(dir / "cls/sub");
  fs::create_directories(dir / "other");
  for (const char* name : {"cls/a.png", "cls/sub/b.png", "other/c.png", "elsewhere.png"})
    std::ofstream(dir / name) << "x";
  const fs::path outside = fs::path(dir.path()).parent_path() / ("linked-" + fs::path(dir.path()).filename().string());
  fs::create_directories(outside);
  std::ofstream(outside / "d.png") << "x";
  fs::create_directory_symlink(".", dir / "cls/loop1");
  fs::create_directory_symlink(".", dir / "cls/loop2");
  fs::create_directory_symlink("..", dir / "cls/sub/up");
  fs::create_directory_symlink(outside, dir / "other/outside");  // followed: a directory not seen before
  const ImageFolder folder(dir.path());
  std::vector<std::string> files;
  for (int64_t i = 0; i < folder.size(); ++i) files.push_back(folder.path(i).substr(dir.path().size() + 1));
  EXPECT_EQ(files, (std::vector<std::string>{"cls/a.png", "cls/sub/b.png", "other/c.png", "other/outside/d.png"}));
  EXPECT_EQ(folder.repeated_directories(), (std::vector<std::string>{"cls/loop1", "cls/loop2", "cls/sub/up"}));
  fs::remove_all(outside);
}

TEST(ImageFolder, ARootWithoutClassesOrAClassWithoutImagesIsRefusedNamingIt) {
  testing::TempDir dir;
  auto message = [](const std::string& root) {
    try {
      ImageFolder folder(root);
    } catch (const c10::ValueError& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_THAT(message(dir / "missing"), HasSubstr("is not a directory"));
  std::ofstream(dir / "loose.png") << "x";
  EXPECT_THAT(message(dir.path()), HasSubstr("has no class sub-directories"));
  std::filesystem::create_directories(dir / "cats");
  std::filesystem::create_directories(dir / "dogs");
  std::ofstream(dir / "cats/a.png") << "x";
  std::ofstream(dir / "dogs/readme.txt") << "x";
  const std::string m = message(dir.path());
  EXPECT_THAT(m, HasSubstr("no image file for the classes dogs"));
  EXPECT_THAT(m, HasSubstr(".png"));
}

// A data set written as PNG files reads back as the same images and labels, in sample order
// within each class.
TEST(ImageFolder, AWrittenDataSetReadsBackWithItsLabels) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1, 28, 28}, std::vector<int64_t>{3, 8, 5}}) {
    testing::TempDir dir;
    const Dataset d = make_synthetic(SyntheticOptions().shape(shape).num_classes(12).size(40).seed(2));
    ASSERT_EQ(write_image_folder(d, dir / "f"), 40);
    const ImageFolder folder(dir / "f");
    ASSERT_EQ(folder.classes().size(), 12u);
    EXPECT_EQ(folder.classes()[2], "02");
    ASSERT_EQ(folder.size(), 40);
    std::vector<int64_t> order(40);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return d.labels[a].item<int64_t>() < d.labels[b].item<int64_t>();
    });
    for (int64_t i = 0; i < 40; ++i) {
      const int64_t j = order[i];
      EXPECT_EQ(folder.target(i), d.labels[j].item<int64_t>()) << i;
      const torch::Tensor expected = d.images[j].permute({1, 2, 0}).expand({shape[1], shape[2], 3});
      EXPECT_TRUE(torch::equal(read_image(folder.path(i)), expected)) << folder.path(i);
    }
  }
}

}  // namespace
}  // namespace lockstep::data
