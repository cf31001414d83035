// ImageFolder's classes and samples against torchvision's for the same tree (written by
// tests/python/image_folders.py), and its refusals.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "../python_script.h"
#include "lockstep/data/image_folder.h"

namespace lockstep::data {
namespace {

using ::testing::HasSubstr;

TEST(ImageFolder, ClassesAndSamplesAreTorchvisionsInTheSameOrder) {
  testing::TempDir dir;
  const auto made = testing::run_python_script("image_folders.py", dir.path() + " 10 0");
  ASSERT_TRUE(made.has_value()) << "python3-torch is needed";
  ASSERT_EQ(made->exit_code, 0) << made->output;
  const auto theirs = nlohmann::json::parse(testing::read_text(dir / "layout.json"));
  const ImageFolder folder(dir / "layout");
  EXPECT_EQ(folder.classes(), theirs["classes"].get<std::vector<std::string>>());
  ASSERT_EQ(folder.size(), static_cast<int64_t>(theirs["samples"].size()));
  for (int64_t i = 0; i < folder.size(); ++i) {
    EXPECT_EQ(folder.path(i), dir / "layout/" + theirs["samples"][i][0].get<std::string>()) << i;
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

}  // namespace
}  // namespace lockstep::data
