#include "lockstep/core/atomic_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "../test_util.h"

namespace lockstep {
namespace {

std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }

TEST(AtomicFile, WritesAndReplacesWholeContents) {
  testing::TempDir dir;
  const std::string path = dir / "model.pt";
  write_file_atomic(path, bytes("first version, long"));
  EXPECT_EQ(read_file(path), bytes("first version, long"));
  write_file_atomic(path, bytes("second"));
  EXPECT_EQ(read_file(path), bytes("second"));
  // Only the target remains: no temporary files left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
}

TEST(AtomicFile, FailedWriteNamesPathAndLeavesNoTemporary) {
  testing::TempDir dir;
  const std::string path = dir / "missing-subdir/model.pt";
  try {
    write_file_atomic(path, bytes("x"));
    FAIL() << "writing into a missing directory must throw";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find(path), std::string::npos)
        << e.what_without_backtrace();
    EXPECT_NE(std::string(e.what_without_backtrace()).find("No such file"), std::string::npos);
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 0);
}

TEST(AtomicFile, FailedRenameLeavesPreviousContentsIntact) {
  testing::TempDir dir;
  // The target is a non-empty directory: the data is written and synced, the rename fails.
  const std::string path = dir / "target";
  std::filesystem::create_directory(path);
  write_file_atomic(path + "/keep", bytes("previous"));
  EXPECT_THROW(write_file_atomic(path, bytes("new")), c10::Error);
  EXPECT_EQ(read_file(path + "/keep"), bytes("previous"));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
}

TEST(AtomicFile, ReadingAMissingFileNamesIt) {
  try {
    read_file("/nonexistent/lockstep/file");
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("/nonexistent/lockstep/file"),
              std::string::npos);
  }
}

// `--init-weights /tmp` used to end in std::ifstream's "basic_filebuf::underflow".
TEST(AtomicFile, ReadingADirectoryNamesItAndSaysItIsADirectory) {
  testing::TempDir dir;
  try {
    read_file(dir.path());
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_EQ(std::string(e.what_without_backtrace()),
              "cannot read '" + dir.path() + "': it is a directory, not a file; give the path of a file");
  }
}

}  // namespace
}  // namespace lockstep
