#pragma once
// Image files as torchvision's ImageFolder reads them.

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace lockstep::data {

// A JPEG or PNG file (told apart by its first bytes, not its name) decoded as torchvision's
// default loader does, PIL's Image.open(path).convert("RGB"): uint8 (H, W, 3). Grayscale is
// repeated into the three channels, an alpha channel is dropped (not composited), a palette is
// expanded. JPEG through libjpeg-turbo with PIL's settings (islow DCT, fancy upsampling), PNG
// through libpng. Throws c10::Error naming `path` and the decoder's complaint for a file that
// cannot be read, is neither format, or is corrupt or truncated; and, before reading it, for a file
// that is not a regular file or is larger than kMaxImageFileBytes (Note [Reading an image file]).
torch::Tensor read_image(const std::string& path);

inline constexpr uint64_t kMaxImageFileBytes = uint64_t{1} << 30;

// The most pixels an image may have, decoded or made by a transform: PIL refuses images over twice
// its MAX_IMAGE_PIXELS (a "decompression bomb"), and so does lockstep.
inline constexpr int64_t kMaxImagePixels = 2 * (int64_t{1024} * 1024 * 1024 / 4 / 3);

// The same from bytes in memory; `name` is what errors call them.
torch::Tensor decode_image(const void* bytes, size_t size, const std::string& name);

// Throws c10::Error naming `name` unless `bytes` start as a JPEG or a PNG file does.
void check_image_magic(const void* bytes, size_t size, const std::string& name);

// A uint8 (H, W, 1) or (H, W, 3) image as an 8-bit grey or RGB PNG file, written atomically.
void write_png(const std::string& path, const torch::Tensor& image);

}  // namespace lockstep::data
