// data/image.h against PIL: every file torchvision's ImageFolder would read, decoded equal to
// Image.open(p).convert("RGB"), and broken files refused with their name.
#include "lockstep/data/image.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <zlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "../test_util.h"
#include "image_oracle.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/process.h"

namespace lockstep::data {
namespace {

using ::testing::HasSubstr;

// Every PNG colour type and depth and every JPEG flavour decodes to PIL's pixels exactly: the
// same libjpeg-turbo with PIL's settings, and PIL's conversions (grey repeated, alpha and palette
// transparency dropped, 1/2/4-bit grey scaled, 16-bit colour by its high byte, 16-bit grey
// clipped at 255; see Note [16-bit grey PNG]).
TEST(Image, DecodesEveryFileAsPilConvertRgb) {
  LOCKSTEP_IMAGE_ORACLE_OR_SKIP(oracle);
  for (const std::string file : {"rgb.png", "l.png", "la.png", "rgba.png", "p.png", "p_trns.png", "bit1.png", "bit2.png",
                                 "bit4.png", "grey16.png", "rgb16.png", "rgba16.png", "la16.png", "noise.png", "grey.jpg",
                                 "rgb420.jpg", "rgb444.jpg", "progressive.jpg"}) {
    const torch::Tensor ours = read_image(oracle->path(file));
    const torch::Tensor pil = oracle->at("decoded/" + file);
    ASSERT_EQ(ours.dtype(), torch::kUInt8) << file;
    ASSERT_EQ(ours.sizes(), pil.sizes()) << file;
    EXPECT_TRUE(torch::equal(ours, pil)) << file << ": max difference " << testing::max_difference(ours, pil);
  }
}

// The format comes from the first bytes: a PNG named .jpg decodes, from memory as from disk.
TEST(Image, TellsFormatsApartByTheirBytesNotTheirNames) {
  LOCKSTEP_IMAGE_ORACLE_OR_SKIP(oracle);
  const std::vector<char> png = read_file(oracle->path("rgb.png"));
  const torch::Tensor decoded = decode_image(png.data(), png.size(), "in-memory.jpg");
  EXPECT_TRUE(torch::equal(decoded, oracle->at("decoded/rgb.png")));
}

// A truncated or corrupt file, a text file named .jpg and an empty file each throw c10::Error
// naming the file and what the decoder said; nothing is printed and nothing crashes.
TEST(Image, RefusesBrokenFilesNamingThemAndTheDecodersComplaint) {
  LOCKSTEP_IMAGE_ORACLE_OR_SKIP(oracle);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"truncated.png", "cannot decode PNG"},    {"truncated.jpg", "cannot decode JPEG"},
      {"corrupt.png", "cannot decode PNG"},      {"corrupt.jpg", "cannot decode JPEG"},
      {"text.jpg", "neither JPEG"},              {"empty.png", "the file is empty"},
      {"no-such-file.png", "No such file or directory"}};
  for (const auto& [file, complaint] : cases) {
    const std::string message = testing::error_message([&] { read_image(oracle->path(file)); });
    EXPECT_THAT(message, HasSubstr(oracle->path(file))) << file;
    EXPECT_THAT(message, HasSubstr(complaint)) << file;
  }
  EXPECT_THAT(testing::error_message([&] { read_image(oracle->path("truncated.png")); }), HasSubstr("truncated"));
  EXPECT_THAT(testing::error_message([&] { read_image(oracle->path("text.jpg")); }), HasSubstr("starts with 6e 6f 74"));
}

// Issue 53 item 6: a FIFO named .png blocked forever, x.png linked to /dev/zero ended in
// std::bad_alloc naming nothing, a 3 GB sparse file was read whole before its first bytes were
// checked. Each is refused naming the file, before its bytes are read (Note [Reading an image file]).
TEST(Image, RefusesWhatCannotBeAnImageFileBeforeReadingIt) {
  testing::TempDir dir;
  const std::string fifo = dir / "pipe.png";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(testing::error_message([&] { read_image(fifo); }),
              HasSubstr("cannot read image '" + fifo + "': it is a pipe (FIFO), not a regular file"));
  const std::string zero = dir / "zero.png";
  std::filesystem::create_symlink("/dev/zero", zero);
  EXPECT_THAT(testing::error_message([&] { read_image(zero); }),
              HasSubstr("cannot read image '" + zero + "': it is a character device, not a regular file"));
  EXPECT_THAT(testing::error_message([&] { read_image(dir.path()); }), HasSubstr("it is a directory"));
  const std::string huge = dir / "huge.png";
  std::ofstream(huge) << "";
  std::filesystem::resize_file(huge, uint64_t{3} << 30);  // sparse: takes no disk
  EXPECT_THAT(testing::error_message([&] { read_image(huge); }),
              HasSubstr("cannot read image '" + huge + "': 3221225472 bytes is more than the 1073741824"));
  // Below the bound, a file that does not start as an image costs its first bytes, not its size.
  const std::string zeros = dir / "zeros.png";
  std::ofstream(zeros) << "";
  std::filesystem::resize_file(zeros, uint64_t{512} << 20);
  const double before = peak_rss_mib();
  EXPECT_THAT(testing::error_message([&] { read_image(zeros); }),
              HasSubstr("neither JPEG (ff d8 ff) nor PNG (89 50 4e 47 ...); it starts with 00 00 00 00 00 00 00 00"));
  EXPECT_LT(peak_rss_mib() - before, 64.0);
}

// A header claiming 60000 x 60000 pixels is refused before any allocation, as PIL refuses a
// decompression bomb.
TEST(Image, RefusesImagesLargerThanPilAccepts) {
  LOCKSTEP_IMAGE_ORACLE_OR_SKIP(oracle);
  std::vector<char> png = read_file(oracle->path("rgb.png"));
  // IHDR's width and height are big-endian at bytes 16..23; the chunk's CRC then fails first
  // unless libpng is told otherwise, so rewrite it too.
  const unsigned char size[8] = {0, 0, 0xEA, 0x60, 0, 0, 0xEA, 0x60};
  std::copy(size, size + 8, png.begin() + 16);
  const uLong crc = crc32(0, reinterpret_cast<const Bytef*>(png.data() + 12), 17);
  for (int i = 0; i < 4; ++i) png[29 + i] = static_cast<char>((crc >> (24 - 8 * i)) & 0xFF);
  EXPECT_THAT(testing::error_message([&] { decode_image(png.data(), png.size(), "bomb.png"); }),
              HasSubstr("'bomb.png': 60000 x 60000 pixels is more than"));
}

// Decoders share no state: 8 threads decoding good and broken files at once get PIL's pixels
// and their own file's error, every time.
TEST(Image, DecodesConcurrentlyOnManyThreads) {
  LOCKSTEP_IMAGE_ORACLE_OR_SKIP(oracle);
  const std::vector<std::string> good = {"rgb420.jpg", "progressive.jpg", "p_trns.png", "rgba16.png"};
  const std::vector<std::string> bad = {"truncated.jpg", "corrupt.jpg", "truncated.png", "corrupt.png"};
  std::vector<torch::Tensor> expected;
  for (const auto& file : good) expected.push_back(oracle->at("decoded/" + file));
  std::atomic<int> wrong{0}, done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const size_t k = static_cast<size_t>(t + i) % good.size();
        if (!torch::equal(read_image(oracle->path(good[k])), expected[k])) ++wrong;
        const std::string message = testing::error_message([&] { read_image(oracle->path(bad[k])); });
        if (message.find(oracle->path(bad[k])) == std::string::npos) ++wrong;
        ++done;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(done.load(), 400);
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace lockstep::data
