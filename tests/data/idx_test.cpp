#include "lockstep/data/idx.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include <chrono>
#include <fstream>

#include "../test_util.h"
#include "lockstep/data/dataset.h"

namespace lockstep::data {
namespace {

using ::testing::HasSubstr;
using lockstep::testing::error_message;

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

std::string idx_images(uint32_t n, uint32_t rows, uint32_t cols, int truncate_by = 0) {
  std::string s = be32(2051) + be32(n) + be32(rows) + be32(cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) s.push_back(static_cast<char>(i % 251));
  s.resize(s.size() - truncate_by);
  return s;
}

std::string idx_labels(uint32_t n) {
  std::string s = be32(2049) + be32(n);
  for (uint32_t i = 0; i < n; ++i) s.push_back(static_cast<char>(i % 10));
  return s;
}

void write_plain(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

void write_gz(const std::string& path, const std::string& content) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, content.data(), static_cast<unsigned>(content.size())),
            static_cast<int>(content.size()));
  gzclose(f);
}

TEST(Idx, ReadsPlainAndGzippedFilesAlike) {
  testing::TempDir dir;
  write_plain(dir / "a", idx_images(3, 4, 5));
  write_gz(dir / "a.gz", idx_images(3, 4, 5));
  torch::Tensor plain = read_idx(dir / "a");
  torch::Tensor gz = read_idx(dir / "a.gz");
  EXPECT_EQ(plain.sizes(), torch::IntArrayRef({3, 1, 4, 5}));
  EXPECT_EQ(plain.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(torch::equal(plain, gz));
  EXPECT_EQ(plain.flatten()[59].item<int>(), 59);
  write_gz(dir / "l.gz", idx_labels(7));
  torch::Tensor labels = read_idx(dir / "l.gz");
  EXPECT_EQ(labels.sizes(), torch::IntArrayRef({7}));
  EXPECT_EQ(labels[6].item<int>(), 6);
}

TEST(Idx, RejectsWrongMagicNamingFileAndValues) {
  testing::TempDir dir;
  write_plain(dir / "bad", be32(1234) + be32(0));
  std::string msg = error_message([&] { read_idx(dir / "bad"); });
  EXPECT_THAT(msg, HasSubstr(dir / "bad"));
  EXPECT_THAT(msg, HasSubstr("magic number 1234"));
  EXPECT_THAT(msg, HasSubstr("2051"));
}

TEST(Idx, RejectsTruncatedFileWithExpectedAndActualSizes) {
  testing::TempDir dir;
  write_gz(dir / "t.gz", idx_images(2, 3, 3, /*truncate_by=*/5));
  std::string msg = error_message([&] { read_idx(dir / "t.gz"); });
  EXPECT_THAT(msg, HasSubstr("truncated"));
  EXPECT_THAT(msg, HasSubstr("18 bytes"));
  EXPECT_THAT(msg, HasSubstr("holds 13 bytes"));
  write_plain(dir / "h", be32(2049));
  EXPECT_THAT(error_message([&] { read_idx(dir / "h"); }), HasSubstr("header"));
}

// A header claiming 65535 images of 65535x65535 bytes (256 TiB) made the reader allocate it all
// first and fail inside LibTorch's allocator without naming the file.
TEST(Idx, HugeHeaderIsCheckedAgainstTheDataBeforeAllocating) {
  testing::TempDir dir;
  for (const std::string& name : {std::string("huge"), std::string("huge.gz")}) {
    const std::string content = be32(2051) + be32(65535) + be32(65535) + be32(65535) + std::string(100, 'x');
    if (name == "huge") write_plain(dir / name, content);
    else write_gz(dir / name, content);
    const auto start = std::chrono::steady_clock::now();
    std::string msg = error_message([&] { read_idx(dir / name); });
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
    EXPECT_THAT(msg, HasSubstr("IDX file '" + (dir / name) + "' is truncated or its header is corrupt"));
    EXPECT_THAT(msg, HasSubstr("promises 65535 images of 65535x65535 bytes (281462092005375 bytes of data) "
                               "but the file holds 100 bytes"));
    EXPECT_THAT(msg, HasSubstr("re-install it"));
  }
  // Labels: 2^32 - 1 promised, 3 present.
  write_plain(dir / "labels", be32(2049) + be32(0xFFFFFFFFu) + "abc");
  EXPECT_THAT(error_message([&] { read_idx(dir / "labels"); }),
              HasSubstr("promises 4294967295 labels (4294967295 bytes of data) but the file holds 3 bytes"));
}

TEST(Idx, MissingFileNamesPathAndPackage) {
  std::string msg = error_message([] { read_idx("/nonexistent/train-images-idx3-ubyte.gz"); });
  EXPECT_THAT(msg, HasSubstr("/nonexistent/train-images-idx3-ubyte.gz"));
  EXPECT_THAT(msg, HasSubstr("apt-get install dataset-fashion-mnist"));
}

TEST(FashionMnist, MissingDirectoryNamesPathAndPackage) {
  std::string msg = error_message([] { load_fashion_mnist("/nonexistent/fmnist", Split::kTrain); });
  EXPECT_THAT(msg, HasSubstr("/nonexistent/fmnist"));
  EXPECT_THAT(msg, HasSubstr("apt-get install dataset-fashion-mnist"));
}

TEST(FashionMnist, MissingLabelFileIsNamed) {
  testing::TempDir dir;
  write_gz(dir / "t10k-images-idx3-ubyte.gz", idx_images(4, 28, 28));
  EXPECT_THAT(error_message([&] { load_fashion_mnist(dir.path(), Split::kTest); }),
              HasSubstr(dir / "t10k-labels-idx1-ubyte.gz"));
}

TEST(FashionMnist, ImageLabelCountMismatchNamesBothFilesAndCounts) {
  testing::TempDir dir;
  write_gz(dir / "t10k-images-idx3-ubyte.gz", idx_images(4, 28, 28));
  write_plain(dir / "t10k-labels-idx1-ubyte", idx_labels(5));  // uncompressed copy is found too
  std::string msg = error_message([&] { load_fashion_mnist(dir.path(), Split::kTest); });
  EXPECT_THAT(msg, HasSubstr("holds 4 images"));
  EXPECT_THAT(msg, HasSubstr("holds 5 labels"));
  EXPECT_THAT(msg, HasSubstr(dir / "t10k-labels-idx1-ubyte"));
}

// Figures from an independent reader (Python's gzip + numpy over the same files).
TEST(FashionMnist, MatchesIndependentReaderOnTheInstalledDataset) {
  if (::access((std::string(kDefaultFashionMnistDir) + "/t10k-labels-idx1-ubyte.gz").c_str(), R_OK) != 0)
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  Dataset train = load_fashion_mnist(kDefaultFashionMnistDir, Split::kTrain);
  Dataset test = load_fashion_mnist(kDefaultFashionMnistDir, Split::kTest);
  EXPECT_EQ(train.images.sizes(), torch::IntArrayRef({60000, 1, 28, 28}));
  EXPECT_EQ(test.images.sizes(), torch::IntArrayRef({10000, 1, 28, 28}));
  EXPECT_EQ(train.images.sum(torch::kInt64).item<int64_t>(), 3431114169LL);
  EXPECT_EQ(test.images.sum(torch::kInt64).item<int64_t>(), 573469082LL);
  EXPECT_EQ(train.labels.sum().item<int64_t>(), 270000);
  EXPECT_TRUE(torch::equal(train.labels.narrow(0, 0, 5), torch::tensor({9, 0, 0, 3, 0})));
  EXPECT_TRUE(torch::equal(test.labels.narrow(0, 0, 5), torch::tensor({9, 2, 1, 1, 6})));
}

TEST(Dataset, BatchNormalisesOnlyTheRequestedSamples) {
  Dataset ds;
  ds.images = torch::tensor({0, 255, 51, 102}, torch::kUInt8).reshape({4, 1, 1, 1});
  ds.labels = torch::tensor({0, 1, 2, 3});
  ds.num_classes = 4;
  ds.mean = 0.2;
  ds.stddev = 0.5;
  auto [x, y] = ds.batch(torch::tensor({3, 1}));
  EXPECT_EQ(x.scalar_type(), torch::kFloat32);
  EXPECT_NEAR(x[0].item<double>(), (102.0 / 255 - 0.2) / 0.5, 1e-6);
  EXPECT_NEAR(x[1].item<double>(), (1.0 - 0.2) / 0.5, 1e-6);
  EXPECT_TRUE(torch::equal(y, torch::tensor({3, 1})));
  EXPECT_EQ(ds.images.scalar_type(), torch::kUInt8);  // the stored copy is untouched
  EXPECT_EQ(ds.take(2).size(), 2);
}

TEST(Synthetic, IsSeededAndHasTheRequestedShape) {
  auto opts = SyntheticOptions().shape({3, 8, 8}).num_classes(5).size(20).seed(7);
  Dataset a = make_synthetic(opts), b = make_synthetic(opts);
  Dataset c = make_synthetic(SyntheticOptions(opts).seed(8));
  EXPECT_EQ(a.images.sizes(), torch::IntArrayRef({20, 3, 8, 8}));
  EXPECT_TRUE(torch::equal(a.images, b.images));
  EXPECT_TRUE(torch::equal(a.labels, b.labels));
  EXPECT_FALSE(torch::equal(a.images, c.images));
  EXPECT_LT(a.labels.max().item<int64_t>(), 5);
  EXPECT_THAT(error_message([] { make_synthetic(SyntheticOptions().shape({3, 0, 8})); }),
              HasSubstr("dimension of 0"));
}

}  // namespace
}  // namespace lockstep::data
