#include "lockstep/log/tfevents_reader.h"

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string_view>

#include "lockstep/log/tensorboard.h"

namespace lockstep::log {
namespace {

// What is wrong inside one record's payload; read_tfevents adds the path, record and offset.
struct Malformed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

uint64_t little_endian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

// One protobuf field: its number, wire type and value (varint, or the bytes of a fixed-width or
// length-delimited value). Written from the protobuf encoding spec, independently of the writer.
struct Field {
  uint64_t number = 0;
  int wire_type = 0;
  uint64_t varint = 0;
  std::string_view bytes;
};

class ProtoReader {
 public:
  explicit ProtoReader(std::string_view buf) : buf_(buf) {}

  // The next field, or false at the end of the message.
  bool next(Field& f) {
    if (pos_ == buf_.size()) return false;
    const uint64_t key = varint();
    f.number = key >> 3;
    f.wire_type = static_cast<int>(key & 7);
    if (f.number == 0) throw Malformed("protobuf field number 0");
    switch (f.wire_type) {
      case 0: f.varint = varint(); break;
      case 1: f.bytes = take(8); break;
      case 2: f.bytes = take(varint()); break;
      case 5: f.bytes = take(4); break;
      default:  // 3 and 4 are groups (deprecated, never in event files); 6 and 7 do not exist
        throw Malformed("protobuf wire type " + std::to_string(f.wire_type) + " (field " +
                        std::to_string(f.number) + ")");
    }
    return true;
  }

 private:
  // Ten bytes at most: 64 bits in groups of 7.
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (pos_ == buf_.size()) throw Malformed("protobuf message ends inside a varint");
      const auto b = static_cast<unsigned char>(buf_[pos_++]);
      if (shift == 63 && b > 1) throw Malformed("protobuf varint overflows 64 bits");
      v |= uint64_t{b & 0x7Fu} << shift;
      if (b < 0x80) return v;
    }
    throw Malformed("protobuf varint longer than 10 bytes");
  }
  std::string_view take(uint64_t n) {
    if (n > buf_.size() - pos_)
      throw Malformed("protobuf field of " + std::to_string(n) + " bytes where " +
                      std::to_string(buf_.size() - pos_) + " remain");
    const std::string_view out = buf_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return out;
  }

  std::string_view buf_;
  size_t pos_ = 0;
};

void expect_wire(const Field& f, int wire_type, const char* name) {
  if (f.wire_type != wire_type)
    throw Malformed(std::string(name) + " (field " + std::to_string(f.number) + ") has wire type " +
                    std::to_string(f.wire_type) + ", expected " + std::to_string(wire_type));
}

// Summary.Value { string tag = 1; float simple_value = 2; ... }
void decode_value(std::string_view buf, std::vector<ScalarValue>& out) {
  ScalarValue v;
  bool scalar = false;
  ProtoReader r(buf);
  for (Field f; r.next(f);) {
    if (f.number == 1) {
      expect_wire(f, 2, "Value.tag");
      v.tag.assign(f.bytes);
    } else if (f.number == 2) {
      expect_wire(f, 5, "Value.simple_value");
      const auto bits = static_cast<uint32_t>(little_endian(f.bytes.data(), 4));
      std::memcpy(&v.value, &bits, sizeof(bits));
      scalar = true;
    }
  }
  if (scalar) out.push_back(std::move(v));
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
// Summary { repeated Value value = 1; }. A repeated summary field merges, as protobuf's does.
Event decode_event(std::string_view buf) {
  Event e;
  ProtoReader r(buf);
  for (Field f; r.next(f);) {
    if (f.number == 1) {
      expect_wire(f, 1, "Event.wall_time");
      const uint64_t bits = little_endian(f.bytes.data(), 8);
      std::memcpy(&e.wall_time, &bits, sizeof(bits));
    } else if (f.number == 2) {
      expect_wire(f, 0, "Event.step");
      e.step = static_cast<int64_t>(f.varint);  // int64 travels as its two's complement
    } else if (f.number == 3) {
      expect_wire(f, 2, "Event.file_version");
      e.file_version.assign(f.bytes);
    } else if (f.number == 5) {
      expect_wire(f, 2, "Event.summary");
      ProtoReader summary(f.bytes);
      for (Field s; summary.next(s);) {
        if (s.number != 1) continue;
        expect_wire(s, 2, "Summary.value");
        decode_value(s.bytes, e.scalars);
      }
    }
  }
  return e;
}

}  // namespace

// Frame: uint64 length, uint32 masked CRC of those 8 bytes, the payload, uint32 masked CRC of the
// payload; all little-endian.
std::vector<Event> read_tfevents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "cannot open TensorBoard event file '", path, "': ", std::strerror(errno));
  in.seekg(0, std::ios::end);
  const auto end = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  const char* fix = "; the file is corrupt or was cut short (a run still writing it: read it again later)";

  std::vector<Event> events;
  std::string payload;
  for (uint64_t offset = 0, index = 0; offset < end; ++index) {
    const std::string where = "TensorBoard event file '" + path + "': record " + std::to_string(index) +
                              " at byte " + std::to_string(offset);
    char header[12];
    TORCH_CHECK(end - offset >= sizeof(header) && in.read(header, sizeof(header)), where,
                " is truncated: the file ends inside its 12-byte header", fix);
    const uint64_t length = little_endian(header, 8);
    const auto length_crc = static_cast<uint32_t>(little_endian(header + 8, 4));
    const uint32_t expected_length_crc = detail::masked_crc32c(std::string_view(header, 8));
    TORCH_CHECK(length_crc == expected_length_crc, where, " has a bad length CRC (stored 0x", std::hex,
                length_crc, ", computed 0x", expected_length_crc, std::dec, ")", fix);
    // Checked against the file's size before allocating: a corrupt length costs no memory.
    const uint64_t remaining = end - offset - sizeof(header);
    TORCH_CHECK(remaining >= 4 && length <= remaining - 4, where, " is truncated: it claims ", length,
                " bytes of data but the file holds ", remaining, " more bytes", fix);
    payload.resize(static_cast<size_t>(length));
    char data_crc_bytes[4];
    TORCH_CHECK(in.read(payload.data(), static_cast<std::streamsize>(length)) &&
                    in.read(data_crc_bytes, sizeof(data_crc_bytes)),
                where, " could not be read: ", std::strerror(errno));
    const auto data_crc = static_cast<uint32_t>(little_endian(data_crc_bytes, 4));
    const uint32_t expected_data_crc = detail::masked_crc32c(payload);
    TORCH_CHECK(data_crc == expected_data_crc, where, " has a bad data CRC (stored 0x", std::hex, data_crc,
                ", computed 0x", expected_data_crc, std::dec, ")", fix);
    try {
      events.push_back(decode_event(payload));
    } catch (const Malformed& e) {
      TORCH_CHECK(false, where, " is not an Event protobuf: ", e.what(), fix);
    }
    offset += sizeof(header) + length + 4;
  }
  return events;
}

}  // namespace lockstep::log
