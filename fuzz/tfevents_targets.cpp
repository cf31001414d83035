#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include "lockstep/log/tensorboard.h"
#include "lockstep/log/tfevents_reader.h"
#include "targets.h"

namespace lockstep::fuzz {
namespace {

// Takes fields from the fuzzer's bytes; past the end every read gives zeros, so any input decodes.
class ByteSource {
 public:
  ByteSource(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{byte()} << (8 * i);
    return v;
  }
  double f64() {
    const uint64_t bits = u64();
    double v = 0;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }
  std::string text() {
    const size_t n = std::min<size_t>(byte(), size_ - std::min(pos_, size_));
    std::string s(reinterpret_cast<const char*>(data_) + pos_, n);
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

struct Scalar {
  std::string tag;
  double value;
  int64_t step;
  std::optional<double> wall_time;
};

uint32_t float_bits(float f) {
  uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}
uint64_t double_bits(double d) {
  uint64_t bits = 0;
  std::memcpy(&bits, &d, sizeof(bits));
  return bits;
}
std::string little_endian_u32(uint32_t v) {
  return {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16), static_cast<char>(v >> 24)};
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Why the scalar `i` read back differs from the one written, or "" when it is the same.
std::string difference(const Scalar& w, const log::Event& e, double start, double end) {
  if (e.scalars.size() != 1) return std::to_string(e.scalars.size()) + " scalars instead of 1";
  const log::ScalarValue& r = e.scalars[0];
  if (r.tag != w.tag) return "tag '" + r.tag + "' instead of '" + w.tag + "'";
  // TensorBoard stores float32: the writer rounds, so the reader must give that float exactly.
  if (float_bits(r.value) != float_bits(static_cast<float>(w.value)))
    return "value " + std::to_string(r.value) + " instead of " + std::to_string(static_cast<float>(w.value));
  if (e.step != w.step) return "step " + std::to_string(e.step) + " instead of " + std::to_string(w.step);
  if (w.wall_time ? double_bits(e.wall_time) != double_bits(*w.wall_time)
                  : !(e.wall_time >= start && e.wall_time <= end))
    return "wall time " + std::to_string(e.wall_time) + " is not the one written";
  if (!e.file_version.empty()) return "a file_version on a scalar's record";
  return "";
}

}  // namespace

void tfevents_round_trip_input(const uint8_t* data, size_t size) {
  ByteSource in(data, size);
  const auto options = log::SummaryWriterOptions().max_queue(1 + in.byte() % 16).flush_secs(in.byte() % 2 ? 0 : 120);
  std::vector<Scalar> written;
  while (!in.empty() && written.size() < 64) {
    Scalar s;
    const uint8_t flags = in.byte();
    s.tag = in.text();
    s.value = in.f64();
    s.step = static_cast<int64_t>(in.u64());
    if (flags & 1) s.wall_time = in.f64();
    written.push_back(std::move(s));
  }

  const std::string dir = input_path("tensorboard");
  std::string path;
  try {
    const double start = now_seconds();
    {
      log::SummaryWriter writer(dir, options);
      path = writer.file_path();
      for (const Scalar& s : written) writer.add_scalar(s.tag, s.value, s.step, s.wall_time);
      writer.close();
    }
    const std::vector<log::Event> events = log::read_tfevents(path);
    const double end = now_seconds();
    if (events.size() != written.size() + 1)
      throw Violation("'" + path + "' holds " + std::to_string(events.size()) + " records after writing " +
                      std::to_string(written.size()) + " scalars and the file_version record");
    if (events[0].file_version != "brain.Event:2" || !events[0].scalars.empty())
      throw Violation("'" + path + "' does not start with the file_version record brain.Event:2");
    for (size_t i = 0; i < written.size(); ++i) {
      const std::string why = difference(written[i], events[i + 1], start, end);
      if (!why.empty()) throw Violation("'" + path + "' scalar " + std::to_string(i) + " came back with " + why);
    }
  } catch (const c10::Error& e) {
    throw Violation(std::string("writing and reading back valid scalars failed: ") + e.what_without_backtrace());
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

void tfevents_reader_input(const uint8_t* data, size_t size) {
  if (size == 0) return;
  std::string file;
  if (data[0] & 1) {
    // Framed: the rest is (length byte, payload)... and each payload gets a TFRecord frame with
    // correct CRCs, so that mutations reach the protobuf decoder instead of failing a CRC.
    ByteSource in(data + 1, size - 1);
    while (!in.empty()) {
      const std::string payload = in.text();
      std::string length;
      for (int i = 0; i < 8; ++i) length.push_back(static_cast<char>((uint64_t{payload.size()} >> (8 * i)) & 0xFF));
      file += length + little_endian_u32(log::detail::masked_crc32c(length)) + payload +
              little_endian_u32(log::detail::masked_crc32c(payload));
    }
  } else {
    file.assign(reinterpret_cast<const char*>(data) + 1, size - 1);
  }
  const std::string path =
      write_input("events.out.tfevents.0.fuzz", reinterpret_cast<const uint8_t*>(file.data()), file.size());
  expect_clean_outcome(path, [&] { log::read_tfevents(path); });
}

}  // namespace lockstep::fuzz
