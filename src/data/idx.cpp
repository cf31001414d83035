#include "lockstep/data/idx.h"

#include <zlib.h>

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <vector>
#include <sys/stat.h>

namespace lockstep::data {
namespace {

constexpr uint32_t kLabelsMagic = 2049;  // 0x00000801: unsigned bytes, 1 dimension
constexpr uint32_t kImagesMagic = 2051;  // 0x00000803: unsigned bytes, 3 dimensions

struct GzFile {
  gzFile file = nullptr;
  ~GzFile() {
    if (file != nullptr) gzclose(file);
  }
};

// Reads exactly `size` bytes (gzread transparently reads uncompressed files too).
// Returns the number actually read, which is less than `size` only at end of file.
size_t read_up_to(gzFile file, void* dst, size_t size, const std::string& path) {
  size_t done = 0;
  auto* out = static_cast<char*>(dst);
  while (done < size) {
    unsigned chunk = static_cast<unsigned>(std::min<size_t>(size - done, 1u << 30));
    int n = gzread(file, out + done, chunk);
    if (n < 0) {
      int err = 0;
      const char* msg = gzerror(file, &err);
      TORCH_CHECK(false, "IDX file '", path, "' is corrupt: ", msg,
                  " (re-install it: apt-get install --reinstall dataset-fashion-mnist)");
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

uint32_t big_endian(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

torch::Tensor read_idx(const std::string& path) {
  struct stat st {};
  TORCH_CHECK(::stat(path.c_str(), &st) == 0, "IDX file '", path, "' not found: ",
              std::strerror(errno),
              " (for Fashion-MNIST run: apt-get install dataset-fashion-mnist, or pass --data-dir)");
  GzFile gz;
  gz.file = gzopen(path.c_str(), "rb");
  TORCH_CHECK(gz.file != nullptr, "cannot open IDX file '", path, "': ", std::strerror(errno));

  std::array<unsigned char, 8> head{};
  TORCH_CHECK(read_up_to(gz.file, head.data(), head.size(), path) == head.size(), "IDX file '",
              path, "' is truncated: it ends inside its 8-byte header");
  uint32_t magic = big_endian(head.data());
  TORCH_CHECK(magic == kImagesMagic || magic == kLabelsMagic, "IDX file '", path,
              "' has magic number ", magic, "; expected ", kImagesMagic, " (images) or ",
              kLabelsMagic, " (labels)");
  const int64_t count = big_endian(head.data() + 4);
  const char* fix = "; re-install it (apt-get install --reinstall dataset-fashion-mnist) or regenerate it";

  std::vector<int64_t> shape{count};
  if (magic == kImagesMagic) {
    std::array<unsigned char, 8> dims{};
    TORCH_CHECK(read_up_to(gz.file, dims.data(), dims.size(), path) == dims.size(), "IDX file '",
                path, "' is truncated: it ends inside its image-size header", fix);
    shape = {count, 1, big_endian(dims.data()), big_endian(dims.data() + 4)};
  }
  // The header is only a claim: the data is read in bounded chunks and the tensor allocated once
  // the bytes are there, so a corrupt header (65535 images of 65535x65535) costs no more memory
  // than the file's real contents.
  uint64_t expected = 1;
  for (int64_t d : shape)
    TORCH_CHECK(!__builtin_mul_overflow(expected, static_cast<uint64_t>(d), &expected), "IDX file '",
                path, "' has an impossible header: dimensions ", c10::Join(" x ", shape),
                " overflow 64 bits", fix);
  std::vector<uint8_t> data;
  constexpr size_t kChunk = size_t{1} << 20;
  while (data.size() < expected) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, expected - data.size()));
    const size_t old = data.size();
    data.resize(old + want);
    const size_t got = read_up_to(gz.file, data.data() + old, want, path);
    data.resize(old + got);
    if (got < want) break;
  }
  TORCH_CHECK(data.size() == expected, "IDX file '", path, "' is truncated or its header is corrupt: ",
              "the header promises ", count,
              magic == kImagesMagic ? c10::str(" images of ", shape[2], "x", shape[3], " bytes")
                                    : std::string(" labels"),
              " (", expected, " bytes of data) but the file holds ", data.size(), " bytes", fix);
  torch::Tensor out = torch::empty(shape, torch::kUInt8);
  if (expected > 0) std::memcpy(out.data_ptr<uint8_t>(), data.data(), data.size());
  return out;
}

}  // namespace lockstep::data
