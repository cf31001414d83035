#include "lockstep/core/zip_checksum.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/process.h"
#include "lockstep/core/torch_load.h"
#include "lockstep/models/torchscript_module.h"

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

// Issue 53 item 9: a 1.7 MB weights file whose data/0 record inflates to 1 GB was read (only
// "claimed <= record" was checked), and the same inside a TorchScript model.pt took 1.2 GB in
// predict. A compressed record is bounded by the archive's size before anything inflates (Note
// [Records that inflate]); torch.save and torch.jit.save never compress.
TEST(ZipChecksum, ARecordThatInflatesFarPastTheFileIsRefusedBeforeItIsRead) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  testing::TempDir dir;
  // Each file rewritten with its data/0 record replaced by 200 MB of zeros, deflated (~200 kB).
  const auto r = testing::run_command(
      python + " -c \"import sys, zipfile, torch\n"
               "d = sys.argv[1]\n"
               "torch.save({'w': torch.zeros(10)}, d + '/w.pt')\n"
               "torch.jit.script(torch.nn.Linear(2, 2)).save(d + '/m.pt')\n"
               "for name in ('w', 'm'):\n"
               "    src = zipfile.ZipFile(d + '/' + name + '.pt')\n"
               "    with zipfile.ZipFile(d + '/' + name + '_bomb.pt', 'w') as out:\n"
               "        for i in src.infolist():\n"
               "            data = bytes(200 << 20) if i.filename.endswith('data/0') else src.read(i)\n"
               "            out.writestr(i.filename, data, compress_type=zipfile.ZIP_DEFLATED)\n"
               "\" '" + dir.path() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double before = peak_rss_mib();
  const std::string weights = error_message([&] { torch_load(read_file(dir / "w_bomb.pt")); });
  EXPECT_THAT(weights, HasSubstr("data/0' is compressed"));
  EXPECT_THAT(weights, HasSubstr("that would inflate to 209715200 in an archive of"));
  EXPECT_THAT(weights, HasSubstr("torch.save and torch.jit.save store records uncompressed"));
  const std::string script = error_message([&] { models::load_torchscript(dir / "m_bomb.pt"); });
  EXPECT_THAT(script, HasSubstr("'" + (dir / "m_bomb.pt") + "' is not a TorchScript module"));
  EXPECT_THAT(script, HasSubstr("would inflate to 209715200"));
  EXPECT_LT(peak_rss_mib() - before, 100.0);  // nothing was inflated
  // The files as Python wrote them still load.
  EXPECT_EQ(torch_load(read_file(dir / "w.pt")).toGenericDict().size(), 1u);
  EXPECT_TRUE(models::load_torchscript(dir / "m.pt").find_method("forward").has_value());
}

}  // namespace
}  // namespace lockstep
