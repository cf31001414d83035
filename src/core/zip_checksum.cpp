#include "lockstep/core/zip_checksum.h"

#include <c10/util/Exception.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

namespace lockstep {
namespace {

// Little-endian reads at an offset already known to be in bounds.
uint64_t read_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string hex32(uint64_t v) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08llx", static_cast<unsigned long long>(v));
  return text;
}

// Bounds-checked view of the archive: every read names what it was reading when it falls outside.
class Archive {
 public:
  explicit Archive(const std::vector<char>& bytes)
      : data_(reinterpret_cast<const unsigned char*>(bytes.data())), size_(bytes.size()) {}

  uint64_t size() const { return size_; }
  const unsigned char* at(uint64_t offset, uint64_t length, const char* what) const {
    TORCH_CHECK(offset <= size_ && length <= size_ - offset, "the zip archive is truncated or corrupt: its ", what,
                " (", length, " bytes at offset ", offset, ") lies beyond its end (", size_, " bytes)");
    return data_ + offset;
  }
  uint64_t u16(uint64_t offset, const char* what) const { return read_le(at(offset, 2, what), 2); }
  uint64_t u32(uint64_t offset, const char* what) const { return read_le(at(offset, 4, what), 4); }
  uint64_t u64(uint64_t offset, const char* what) const { return read_le(at(offset, 8, what), 8); }

 private:
  const unsigned char* data_;
  uint64_t size_;
};

// Note [Records that inflate]
// torch.save and torch.jit.save write every record stored (uncompressed), so a record's size is
// bounded by the file's. A deflated one can claim a thousand times its bytes (a 1.7 MB file whose
// data/0 inflates to 1 GB), and LibTorch's reader inflates a record whole into memory when it is
// asked for it. torch_load compares each storage record with what its storage needs before reading
// it (Note [Storage sizes come from the pickle]), but torch::jit::load reads a TorchScript file's
// records itself, and data.pkl has no such measure. So a compressed record may declare at most
// kMaxInflation times the archive's size (at least kMinInflationBound), checked here from the
// central directory, before any record is read.
constexpr uint64_t kMaxInflation = 16;
constexpr uint64_t kMinInflationBound = uint64_t{64} << 20;

constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kZip64EndOfDirectory = 0x06064b50;
constexpr uint32_t kDirectoryEntry = 0x02014b50;
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint64_t kMaxComment = 0xffff;

struct Directory {
  uint64_t entries = 0;
  uint64_t offset = 0;
};

// The end-of-central-directory record sits in the last 22 + (up to 65535 comment) bytes.
Directory find_directory(const Archive& a) {
  TORCH_CHECK(a.size() >= 22, "the zip archive is truncated: ", a.size(), " bytes, less than its end record");
  const uint64_t lowest = a.size() - 22 - std::min<uint64_t>(kMaxComment, a.size() - 22);
  for (uint64_t end = a.size() - 22;; --end) {
    if (a.u32(end, "end record") == kEndOfDirectory) {
      Directory d{a.u16(end + 10, "entry count"), a.u32(end + 16, "directory offset")};
      if ((d.entries == 0xffff || d.offset == 0xffffffff) && end >= 20 &&
          a.u32(end - 20, "zip64 locator") == kZip64Locator) {
        const uint64_t end64 = a.u64(end - 20 + 8, "zip64 end record offset");
        TORCH_CHECK(a.u32(end64, "zip64 end record") == kZip64EndOfDirectory,
                    "the zip archive is corrupt: no zip64 end record at offset ", end64);
        d.entries = a.u64(end64 + 32, "zip64 entry count");
        d.offset = a.u64(end64 + 48, "zip64 directory offset");
      }
      return d;
    }
    TORCH_CHECK(end > lowest, "the zip archive is truncated or corrupt: it has no end-of-directory record");
  }
}

// A stored or deflated record's bytes -> their CRC-32.
uint64_t crc_of(const unsigned char* data, uint64_t compressed, uint64_t uncompressed, uint64_t method,
                const std::string& name) {
  uLong crc = crc32(0L, Z_NULL, 0);
  if (method == 0) {
    TORCH_CHECK(compressed == uncompressed, "the zip archive is corrupt: record '", name, "' is stored with ",
                compressed, " bytes but says it holds ", uncompressed);
    for (uint64_t done = 0; done < compressed;) {
      const uInt n = static_cast<uInt>(std::min<uint64_t>(compressed - done, 1u << 30));
      crc = crc32(crc, data + done, n);
      done += n;
    }
    return crc;
  }
  TORCH_CHECK(method == 8, "the zip archive's record '", name, "' uses compression method ", method,
              "; torch.save writes only stored (0) or deflated (8) records");
  z_stream z{};
  TORCH_CHECK(inflateInit2(&z, -MAX_WBITS) == Z_OK, "cannot start zlib to check record '", name, "'");
  z.next_in = const_cast<unsigned char*>(data);
  z.avail_in = static_cast<uInt>(std::min<uint64_t>(compressed, UINT32_MAX));
  unsigned char out[1 << 16];
  uint64_t produced = 0;
  int status = Z_OK;
  while (status == Z_OK) {
    z.next_out = out;
    z.avail_out = sizeof(out);
    status = inflate(&z, Z_NO_FLUSH);
    const uint64_t n = sizeof(out) - z.avail_out;
    crc = crc32(crc, out, static_cast<uInt>(n));
    produced += n;
    if (status == Z_BUF_ERROR && z.avail_in == 0) break;
  }
  inflateEnd(&z);
  TORCH_CHECK(status == Z_STREAM_END && produced == uncompressed, "the zip archive is corrupt: record '", name,
              "' does not inflate to its ", uncompressed, " bytes");
  return crc;
}

}  // namespace

void verify_zip_checksums(const std::vector<char>& bytes) {
  const Archive a(bytes);
  const Directory directory = find_directory(a);
  uint64_t entry = directory.offset;
  for (uint64_t i = 0; i < directory.entries; ++i) {
    TORCH_CHECK(a.u32(entry, "directory entry") == kDirectoryEntry, "the zip archive is corrupt: directory entry ",
                i, " of ", directory.entries, " at offset ", entry, " has a bad signature");
    const uint64_t method = a.u16(entry + 10, "compression method");
    const uint64_t stored_crc = a.u32(entry + 16, "CRC-32");
    uint64_t compressed = a.u32(entry + 20, "compressed size");
    uint64_t uncompressed = a.u32(entry + 24, "size");
    const uint64_t name_length = a.u16(entry + 28, "name length");
    const uint64_t extra_length = a.u16(entry + 30, "extra field length");
    const uint64_t comment_length = a.u16(entry + 32, "comment length");
    uint64_t local = a.u32(entry + 42, "local header offset");
    const unsigned char* name_bytes = a.at(entry + 46, name_length, "record name");
    const std::string name(reinterpret_cast<const char*>(name_bytes), name_length);

    // Sizes and offsets too large for 32 bits move to the zip64 extra field (id 1), in this order.
    for (uint64_t x = entry + 46 + name_length; x + 4 <= entry + 46 + name_length + extra_length;) {
      const uint64_t id = a.u16(x, "extra field id"), length = a.u16(x + 2, "extra field length");
      if (id == 1) {
        uint64_t field = x + 4;
        if (uncompressed == 0xffffffff) uncompressed = a.u64(field, "zip64 size"), field += 8;
        if (compressed == 0xffffffff) compressed = a.u64(field, "zip64 compressed size"), field += 8;
        if (local == 0xffffffff) local = a.u64(field, "zip64 local header offset");
      }
      x += 4 + length;
    }

    TORCH_CHECK(a.u32(local, "local header") == kLocalHeader, "the zip archive is corrupt: record '", name,
                "' has no local header at offset ", local);
    const uint64_t data_offset = local + 30 + a.u16(local + 26, "local name length") +
                                 a.u16(local + 28, "local extra field length");
    // See Note [Records that inflate]: before anything is inflated or allocated.
    const uint64_t most = std::max<uint64_t>(a.size() * kMaxInflation, kMinInflationBound);
    TORCH_CHECK(method == 0 || uncompressed <= most, "record '", name, "' is compressed ", compressed, " bytes that ",
                "would inflate to ", uncompressed, " in an archive of ", a.size(), " bytes; torch.save and "
                "torch.jit.save store records uncompressed, and a record may take at most ", most,
                " bytes of memory here: write the file with torch.save again");
    const unsigned char* data = a.at(data_offset, compressed, "record data");
    const uint64_t crc = crc_of(data, compressed, uncompressed, method, name);
    TORCH_CHECK(crc == stored_crc, "record '", name, "' fails its CRC-32 check (stored ", hex32(stored_crc),
                ", computed ", hex32(crc), "): the file is corrupt, e.g. a flipped bit or a damaged copy");
    entry += 46 + name_length + extra_length + comment_length;
  }
}

}  // namespace lockstep
