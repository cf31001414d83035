// PNG files written from uint8 images, for image folders made from in-memory data sets (the bench's
// image-folder row, tests).
#include <png.h>

#include <c10/util/Exception.h>

#include <vector>

#include "lockstep/core/atomic_file.h"
#include "lockstep/data/image.h"

namespace lockstep::data {

void write_png(const std::string& path, const torch::Tensor& image) {
  TORCH_CHECK_VALUE(image.scalar_type() == torch::kUInt8 && image.dim() == 3 && (image.size(2) == 1 || image.size(2) == 3),
                    "write_png: '", path, "' needs a uint8 (H, W, 1 or 3) image, not ", image.scalar_type(), " ",
                    image.sizes());
  const torch::Tensor pixels = image.contiguous();
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(pixels.size(1));
  png.height = static_cast<png_uint_32>(pixels.size(0));
  png.format = pixels.size(2) == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  TORCH_CHECK(png_image_write_to_memory(&png, nullptr, &size, 0, pixels.data_ptr<uint8_t>(), 0, nullptr) != 0,
              "cannot encode PNG '", path, "': ", png.message);
  std::vector<char> bytes(size);
  TORCH_CHECK(png_image_write_to_memory(&png, bytes.data(), &size, 0, pixels.data_ptr<uint8_t>(), 0, nullptr) != 0,
              "cannot encode PNG '", path, "': ", png.message);
  bytes.resize(size);
  write_file_atomic(path, bytes);
}

}  // namespace lockstep::data
