#include "lockstep/core/zip_checksum.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/torch_load.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using testing::error_message;

// A pickled dict {"w": 0, 1, 2, ... 99 as float32} in the zip layout torch.save writes, and the
// offset of the tensor's bytes inside it.
std::pair<std::vector<char>, size_t> archive_with_known_tensor() {
  c10::Dict<std::string, torch::Tensor> dict;
  dict.insert("w", torch::arange(100, torch::kFloat32));
  std::vector<char> bytes = torch::pickle_save(dict);
  float needle[4] = {40.f, 41.f, 42.f, 43.f};
  const char* begin = reinterpret_cast<const char*>(needle);
  auto at = std::search(bytes.begin(), bytes.end(), begin, begin + sizeof(needle));
  return {bytes, static_cast<size_t>(at - bytes.begin())};
}

TEST(ZipChecksum, IntactArchivesPassAndLoad) {
  auto [bytes, offset] = archive_with_known_tensor();
  ASSERT_LT(offset, bytes.size()) << "the tensor's bytes were not found in the archive";
  EXPECT_NO_THROW(verify_zip_checksums(bytes));
  EXPECT_TRUE(torch::equal(torch_load(bytes).toGenericDict().at("w").toTensor(), torch::arange(100, torch::kFloat32)));
}

// LibTorch's reader does not check CRCs: the flipped bit would load as 42 -> 42.000004.
TEST(ZipChecksum, AFlippedBitInsideATensorIsRefusedNamingTheRecord) {
  auto [bytes, offset] = archive_with_known_tensor();
  ASSERT_LT(offset, bytes.size());
  bytes[offset + 8] ^= 0x01;  // the lowest mantissa bit of 42.0f
  EXPECT_THAT(error_message([&] { verify_zip_checksums(bytes); }),
              ::testing::AllOf(HasSubstr("/data/0' fails its CRC-32 check (stored 0x"), HasSubstr("the file is corrupt")));
  EXPECT_THAT(error_message([&] { torch_load(bytes); }), HasSubstr("fails its CRC-32 check"));
}

TEST(ZipChecksum, TruncatedOrNonZipBytesAreRefusedSayingWhy) {
  auto [bytes, offset] = archive_with_known_tensor();
  std::vector<char> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2));
  EXPECT_THAT(error_message([&] { verify_zip_checksums(cut); }), HasSubstr("no end-of-directory record"));
  EXPECT_THAT(error_message([&] { verify_zip_checksums(std::vector<char>(10, 'x')); }), HasSubstr("truncated"));
}

// Independent writers: Python's torch.save, and Python's zipfile with deflated records (which
// torch.save never writes, but a re-zipped file may hold).
TEST(ZipChecksum, ArchivesWrittenByPythonPassAndACorruptDeflatedRecordFails) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  testing::TempDir dir;
  const auto r = testing::run_command(
      python + " -c \"import torch, zipfile; torch.save({'w': torch.arange(1000.)}, '" + dir / "t.pt" + "');" +
      "z = zipfile.ZipFile('" + dir / "d.zip" + "', 'w', zipfile.ZIP_DEFLATED); z.writestr('a/x', b'abc' * 5000); "
      "z.close()\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NO_THROW(verify_zip_checksums(read_file(dir / "t.pt")));
  std::vector<char> deflated = read_file(dir / "d.zip");
  EXPECT_NO_THROW(verify_zip_checksums(deflated));
  deflated[40] ^= 0x10;  // inside the compressed data (the local header is 30 + 3 bytes)
  EXPECT_THAT(error_message([&] { verify_zip_checksums(deflated); }), HasSubstr("record 'a/x'"));
}

}  // namespace
}  // namespace lockstep
