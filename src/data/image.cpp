#include "lockstep/data/image.h"

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>


// Both libraries report errors through a callback that must not return; the callbacks here
// longjmp back to a setjmp in a helper that holds only plain C state (a jump skips destructors),
// and the caller turns the saved message into a c10::Error once the decoder is destroyed. Every
// decoder state lives on the caller's stack, so concurrent decodes share nothing.

namespace lockstep::data {
namespace {

constexpr unsigned char kJpegMagic[] = {0xFF, 0xD8, 0xFF};
constexpr unsigned char kPngMagic[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

// Before allocating: a 60-byte PNG can claim to be 10^6 x 10^6.
void check_pixels(const std::string& name, int64_t height, int64_t width) {
  TORCH_CHECK(height * width <= kMaxImagePixels, "cannot decode image '", name, "': ", height, " x ", width,
              " pixels is more than the ", kMaxImagePixels, " PIL accepts (a decompression bomb?)");
}

bool starts_with(const unsigned char* bytes, size_t size, const unsigned char* magic, size_t magic_size) {
  return size >= magic_size && std::memcmp(bytes, magic, magic_size) == 0;
}

// --- JPEG ------------------------------------------------------------------------------------

struct JpegErrors {
  jpeg_error_mgr pub;  // first: libjpeg hands back a pointer to it
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  cinfo->err->format_message(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

// Warnings (level -1) are dropped as PIL drops them, except running out of data: libjpeg would
// pad the image with grey and go on, where PIL raises "image file is truncated".
void jpeg_warn(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_fail(cinfo);
}

void jpeg_silent(j_common_ptr) {}

// Reads the header and sets up decompression to RGB. False (with errors->message) on failure.
bool jpeg_start(jpeg_decompress_struct* cinfo, JpegErrors* errors, const unsigned char* bytes, size_t size,
                bool* cmyk) {
  if (setjmp(errors->jump) != 0) return false;
  jpeg_mem_src(cinfo, bytes, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  *cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
  if (*cmyk) return true;
  // PIL's settings: the accurate integer DCT and fancy upsampling are libjpeg's defaults, set
  // here so they hold whatever the library's build defaults. Grayscale is repeated into RGB by
  // libjpeg-turbo itself, as PIL's convert("RGB") of an "L" image does.
  cinfo->dct_method = JDCT_ISLOW;
  cinfo->do_fancy_upsampling = TRUE;
  cinfo->out_color_space = JCS_RGB;
  return true;
}

// Decodes every scanline into `out`, (H, W, 3) uint8 with the header's H and W (no scaling).
bool jpeg_rows(jpeg_decompress_struct* cinfo, JpegErrors* errors, unsigned char* out) {
  if (setjmp(errors->jump) != 0) return false;
  jpeg_start_decompress(cinfo);
  const size_t stride = static_cast<size_t>(cinfo->output_width) * 3;
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = out + cinfo->output_scanline * stride;
    jpeg_read_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_decompress(cinfo);
  return true;
}

torch::Tensor decode_jpeg(const unsigned char* bytes, size_t size, const std::string& name) {
  jpeg_decompress_struct cinfo{};
  JpegErrors errors{};
  cinfo.err = jpeg_std_error(&errors.pub);
  errors.pub.error_exit = jpeg_fail;
  errors.pub.emit_message = jpeg_warn;
  errors.pub.output_message = jpeg_silent;
  jpeg_create_decompress(&cinfo);
  struct Destroy {
    jpeg_decompress_struct* cinfo;
    ~Destroy() { jpeg_destroy_decompress(cinfo); }
  } destroy{&cinfo};

  bool cmyk = false;
  TORCH_CHECK(jpeg_start(&cinfo, &errors, bytes, size, &cmyk), "cannot decode JPEG '", name, "': ", errors.message);
  // PIL converts CMYK to RGB with its own naive formula; rather than guess at it, refuse.
  TORCH_CHECK(!cmyk, "cannot decode JPEG '", name,
              "': it is CMYK (or YCCK), which lockstep does not convert to RGB; convert the file to RGB "
              "(e.g. PIL's Image.open(p).convert('RGB').save(p))");
  check_pixels(name, cinfo.image_height, cinfo.image_width);
  auto image = torch::empty({cinfo.image_height, cinfo.image_width, 3}, torch::kUInt8);
  TORCH_CHECK(jpeg_rows(&cinfo, &errors, image.data_ptr<uint8_t>()), "cannot decode JPEG '", name, "': ",
              errors.message);
  return image;
}

// --- PNG -------------------------------------------------------------------------------------

struct PngState {
  std::jmp_buf jump;
  char message[256];
  const unsigned char* bytes;
  size_t size;
  size_t offset;
};

[[noreturn]] void png_fail(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(state->message, sizeof(state->message), "%s", message);
  std::longjmp(state->jump, 1);
}

void png_ignore_warning(png_structp, png_const_charp) {}

void png_read_bytes(png_structp png, png_bytep out, png_size_t count) {
  auto* state = static_cast<PngState*>(png_get_io_ptr(png));
  if (state->size - state->offset < count) png_error(png, "the file is truncated");
  std::memcpy(out, state->bytes + state->offset, count);
  state->offset += count;
}

// Note [16-bit grey PNG]
// PIL 9.4 opens a 16-bit greyscale PNG as mode "I" (32-bit integers) and its convert("RGB")
// clips each value to 255 rather than scaling it: 0..255 stay, anything brighter is white. We
// match that, since torchvision's ImageFolder is what a model trained in Python has seen. Every
// other 16-bit PNG (RGB, RGBA, grey with alpha) PIL reads through its most significant byte,
// which is libpng's png_set_strip_16.
struct PngLayout {
  uint32_t width = 0, height = 0;
  bool grey16 = false;  // rows are big-endian 16-bit grey, (W) values; see Note [16-bit grey PNG]
};

bool png_start(png_structp png, png_infop info, PngState* state, PngLayout* layout) {
  if (setjmp(state->jump) != 0) return false;
  png_set_read_fn(png, state, png_read_bytes);
  png_read_info(png, info);
  png_uint_32 width = 0, height = 0;
  int depth = 0, color = 0;
  png_get_IHDR(png, info, &width, &height, &depth, &color, nullptr, nullptr, nullptr);
  layout->width = width;
  layout->height = height;
  layout->grey16 = color == PNG_COLOR_TYPE_GRAY && depth == 16;
  if (!layout->grey16) {
    // To RGB as PIL's convert("RGB"): palette expanded (its transparency dropped), 1/2/4-bit grey
    // scaled to 0..255 by bit replication (1 bit: 0/255), alpha dropped without compositing.
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16) png_set_strip_16(png);
    if ((color & PNG_COLOR_MASK_ALPHA) != 0 || png_get_valid(png, info, PNG_INFO_tRNS) != 0) png_set_strip_alpha(png);
    if ((color & PNG_COLOR_MASK_COLOR) == 0) png_set_gray_to_rgb(png);
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t expected = layout->grey16 ? size_t{width} * 2 : size_t{width} * 3;
  if (png_get_rowbytes(png, info) != expected) png_error(png, "unexpected row layout after conversion to RGB");
  return true;
}

bool png_rows(png_structp png, PngState* state, png_bytepp rows) {
  if (setjmp(state->jump) != 0) return false;
  png_read_image(png, rows);
  return true;
}

torch::Tensor decode_png(const unsigned char* bytes, size_t size, const std::string& name) {
  PngState state{};
  state.bytes = bytes;
  state.size = size;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &state, png_fail, png_ignore_warning);
  TORCH_CHECK(png != nullptr, "cannot decode PNG '", name, "': libpng could not allocate its decoder");
  png_infop info = png_create_info_struct(png);
  struct Destroy {
    png_structp png;
    png_infop info;
    ~Destroy() { png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr); }
  } destroy{png, info};
  TORCH_CHECK(info != nullptr, "cannot decode PNG '", name, "': libpng could not allocate its decoder");

  PngLayout layout;
  TORCH_CHECK(png_start(png, info, &state, &layout), "cannot decode PNG '", name, "': ", state.message);
  const int64_t h = layout.height, w = layout.width;
  check_pixels(name, h, w);
  auto image = torch::empty({h, w, 3}, torch::kUInt8);
  uint8_t* out = image.data_ptr<uint8_t>();
  std::vector<unsigned char> grey16(layout.grey16 ? static_cast<size_t>(h * w * 2) : 0);
  unsigned char* target = layout.grey16 ? grey16.data() : out;
  const size_t stride = layout.grey16 ? static_cast<size_t>(w) * 2 : static_cast<size_t>(w) * 3;
  std::vector<png_bytep> rows(static_cast<size_t>(h));
  for (int64_t y = 0; y < h; ++y) rows[y] = target + y * stride;
  TORCH_CHECK(png_rows(png, &state, rows.data()), "cannot decode PNG '", name, "': ", state.message);
  if (layout.grey16) {  // See Note [16-bit grey PNG]
    for (int64_t i = 0; i < h * w; ++i) {
      const unsigned value = (unsigned{grey16[2 * i]} << 8) | grey16[2 * i + 1];
      out[3 * i] = out[3 * i + 1] = out[3 * i + 2] = static_cast<uint8_t>(std::min(value, 255u));
    }
  }
  return image;
}

}  // namespace

torch::Tensor decode_image(const void* bytes, size_t size, const std::string& name) {
  const auto* data = static_cast<const unsigned char*>(bytes);
  check_image_magic(data, size, name);
  return starts_with(data, size, kJpegMagic, sizeof(kJpegMagic)) ? decode_jpeg(data, size, name)
                                                                  : decode_png(data, size, name);
}

void check_image_magic(const void* bytes, size_t size, const std::string& name) {
  const auto* data = static_cast<const unsigned char*>(bytes);
  TORCH_CHECK(size > 0, "cannot decode image '", name, "': the file is empty");
  if (starts_with(data, size, kJpegMagic, sizeof(kJpegMagic)) || starts_with(data, size, kPngMagic, sizeof(kPngMagic)))
    return;
  char head[3 * 8 + 1] = {};
  for (size_t i = 0; i < std::min<size_t>(size, 8); ++i) std::snprintf(head + 3 * i, 4, "%02x ", data[i]);
  TORCH_CHECK(false, "cannot decode image '", name, "': it is neither JPEG (ff d8 ff) nor PNG (89 50 4e 47 ...); ",
              "it starts with ", std::string(head, std::strlen(head) - 1));
}

// Note [Reading an image file]
// A file is read only when it can be an image: a regular file (a FIFO would block forever, a link
// to /dev/zero never ends), at most kMaxImageFileBytes (the largest image PIL decodes, kMaxImagePixels,
// stored raw, is 0.5 GiB), and starting with JPEG's or PNG's magic bytes, which are read first: a
// 3 GB file of zeros costs 8 bytes, not 3 GB.
torch::Tensor read_image(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // O_NONBLOCK: a FIFO opens at once
  TORCH_CHECK(fd >= 0, "cannot read image '", path, "': ", std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  TORCH_CHECK(::fstat(fd, &st) == 0, "cannot read image '", path, "': ", std::strerror(errno));
  TORCH_CHECK(S_ISREG(st.st_mode), "cannot read image '", path, "': it is ",
              S_ISDIR(st.st_mode)    ? "a directory"
              : S_ISFIFO(st.st_mode) ? "a pipe (FIFO)"
              : S_ISCHR(st.st_mode)  ? "a character device"
              : S_ISBLK(st.st_mode)  ? "a block device"
                                     : "a socket",
              ", not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  TORCH_CHECK(size <= kMaxImageFileBytes, "cannot read image '", path, "': ", size, " bytes is more than the ",
              kMaxImageFileBytes, " an image file may have (the largest image PIL decodes, stored raw, is smaller)");
  size_t got = 0;
  auto read_up_to = [&](char* into, size_t want) {  // into[got, want)
    while (got < want) {
      const ssize_t n = ::read(fd, into + got, want - got);
      if (n < 0 && errno == EINTR) continue;
      TORCH_CHECK(n >= 0, "cannot read image '", path, "': ", std::strerror(errno));
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
  };
  char head[sizeof(kPngMagic)];
  read_up_to(head, std::min<size_t>(size, sizeof(head)));
  check_image_magic(head, got, path);
  std::vector<char> bytes(size);
  std::memcpy(bytes.data(), head, got);
  read_up_to(bytes.data(), size);
  TORCH_CHECK(got == size, "cannot read image '", path, "': it has ", got, " of its ", size,
              " bytes; it changed while it was read");
  return decode_image(bytes.data(), bytes.size(), path);
}

}  // namespace lockstep::data
