#include "lockstep/log/tensorboard.h"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

namespace lockstep::log {
namespace detail {
namespace {

// Byte-at-a-time table for the reflected Castagnoli polynomial.
constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ ((c & 1) ? 0x82F63B78u : 0u);
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : bytes) crc = kCrc32cTable[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

}  // namespace detail

namespace {

// --- a hand-written protobuf encoder for the few fields we write ---------------------------
// The subset of tensorflow/core/util/event.proto and framework/summary.proto used here:
//   message Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//                     Summary summary = 5; }
//   message Summary { repeated Value value = 1; }
//   message Value   { string tag = 1; float simple_value = 2; }
// Fixed-width fields are little-endian; wire types: 0 varint, 1 fixed64, 2 length-delimited,
// 5 fixed32.

void put_little_endian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>((v & 0x7F) | 0x80));
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}

// int64 is encoded as its two's-complement uint64, so a negative step takes ten bytes.
void put_int64(std::string& out, int field, int64_t v) {
  put_key(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));
}

void put_double(std::string& out, int field, double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  put_key(out, field, 1);
  put_little_endian(out, bits, 8);
}

void put_float(std::string& out, int field, float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  put_key(out, field, 5);
  put_little_endian(out, bits, 4);
}

void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0) return "localhost";
  return buf.data();
}

}  // namespace

SummaryWriter::SummaryWriter(const std::string& log_dir, SummaryWriterOptions options)
    : log_dir_(log_dir), options_(options), last_flush_(std::chrono::steady_clock::now()) {
  TORCH_CHECK(options_.max_queue() >= 1, "SummaryWriter: max_queue must be >= 1, got ",
              options_.max_queue());
  TORCH_CHECK(options_.flush_secs() >= 0, "SummaryWriter: flush_secs must be >= 0, got ",
              options_.flush_secs());
  std::error_code ec;
  std::filesystem::create_directories(log_dir_, ec);
  TORCH_CHECK(!ec, "SummaryWriter: cannot create log directory '", log_dir_, "': ", ec.message());

  // TensorFlow's and PyTorch's name; the pid and a per-process counter keep two writers started
  // in the same second (several runs, or one process opening two) from sharing a file.
  static std::atomic<int> next_uid{0};
  path_ = log_dir_ + "/events.out.tfevents." +
          std::to_string(static_cast<int64_t>(now_seconds())) + "." + hostname() + "." +
          std::to_string(::getpid()) + "." + std::to_string(next_uid++);
  file_ = std::fopen(path_.c_str(), "wbxe");  // x: never truncate another writer's file
  TORCH_CHECK(file_ != nullptr, "SummaryWriter: cannot create '", path_, "': ",
              std::strerror(errno));

  std::string event;
  put_double(event, 1, now_seconds());
  put_bytes(event, 3, "brain.Event:2");
  write_record(event);
  flush();  // a valid file from the start, so TensorBoard lists the run at once
}

SummaryWriter::~SummaryWriter() {
  try {
    close();
  } catch (const c10::Error& e) {
    TORCH_WARN(e.what_without_backtrace());
  }
}

void SummaryWriter::add_scalar(const std::string& tag, double value, int64_t global_step,
                               std::optional<double> walltime) {
  std::string value_msg;
  put_bytes(value_msg, 1, tag);
  put_float(value_msg, 2, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, 1, value_msg);
  std::string event;
  put_double(event, 1, walltime.value_or(now_seconds()));
  put_int64(event, 2, global_step);
  put_bytes(event, 5, summary);
  write_record(event);

  // Note [When SummaryWriter flushes]
  // Records collect in stdio's buffer so that logging a scalar costs no system call. As in PyTorch,
  // they are handed to the OS after max_queue records or once flush_secs have passed, so that
  // TensorBoard sees a running job's curves and a crashed job keeps what it logged. There is no
  // background thread: the time is checked here, so after the last add_scalar up to
  // max_queue - 1 records wait for flush() or close().
  if (pending_ >= options_.max_queue() ||
      std::chrono::steady_clock::now() - last_flush_ >=
          std::chrono::duration<double>(options_.flush_secs())) {
    flush();
  }
}

// Frame: uint64 length, uint32 masked CRC of those 8 bytes, the data, uint32 masked CRC of the
// data; all little-endian.
void SummaryWriter::write_record(const std::string& event) {
  TORCH_CHECK(file_ != nullptr, "SummaryWriter: '", path_, "' is already closed");
  std::string record;
  put_little_endian(record, event.size(), 8);
  put_little_endian(record, detail::masked_crc32c(record), 4);
  record += event;
  put_little_endian(record, detail::masked_crc32c(event), 4);
  TORCH_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size(),
              "SummaryWriter: writing '", path_, "' failed: ", std::strerror(errno));
  ++pending_;
}

void SummaryWriter::flush() {
  TORCH_CHECK(file_ != nullptr, "SummaryWriter: '", path_, "' is already closed");
  TORCH_CHECK(std::fflush(file_) == 0, "SummaryWriter: writing '", path_, "' failed: ",
              std::strerror(errno));
  pending_ = 0;
  last_flush_ = std::chrono::steady_clock::now();
}

void SummaryWriter::close() {
  if (file_ == nullptr) return;
  // fclose releases the stream even when its final flush fails.
  TORCH_CHECK(std::fclose(std::exchange(file_, nullptr)) == 0, "SummaryWriter: writing '", path_,
              "' failed: ", std::strerror(errno));
}

}  // namespace lockstep::log
