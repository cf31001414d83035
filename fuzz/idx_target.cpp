#include <zlib.h>

#include "lockstep/data/idx.h"
#include "targets.h"

namespace lockstep::fuzz {
namespace {

std::string write_gzipped(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = input_path(name);
  gzFile gz = gzopen(path.c_str(), "wb");
  TORCH_CHECK(gz != nullptr, "fuzz: cannot open '", path, "' for gzip");
  const int written = size == 0 ? 0 : gzwrite(gz, data, static_cast<unsigned>(size));
  const int closed = gzclose(gz);
  TORCH_CHECK(written == static_cast<int>(size) && closed == Z_OK, "fuzz: gzip-writing '", path, "' failed");
  return path;
}

}  // namespace

void idx_input(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const bool gzip = (data[0] & 1) != 0;
  const std::string path = gzip ? write_gzipped("input-idx.gz", data + 1, size - 1)
                                : write_input("input-idx", data + 1, size - 1);
  expect_clean_outcome(path, [&] {
    const torch::Tensor images_or_labels = data::read_idx(path);
    // What is accepted must be what the header promised: labels (N) or images (N, 1, rows, cols).
    if (images_or_labels.scalar_type() != torch::kUInt8 ||
        (images_or_labels.dim() != 1 && images_or_labels.dim() != 4))
      throw Violation("read_idx('" + path + "') returned a tensor of type " +
                      std::string(c10::toString(images_or_labels.scalar_type())) + " with " +
                      std::to_string(images_or_labels.dim()) + " dimensions");
  });
}

}  // namespace lockstep::fuzz
