#include "lockstep/log/tfevents_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/log/tensorboard.h"

namespace lockstep::log {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::error_message;

std::string write_scalars(const std::string& dir) {
  SummaryWriter w(dir);
  w.add_scalar("train/loss", 0.75, 0, 1000.5);
  w.add_scalar("train/loss", 0.5, 10, 1001.25);
  w.add_scalar("eval/acc", 0.875, -3, 1002.0);
  w.close();
  return w.file_path();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::string le(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}

// One TFRecord around `payload`, with correct CRCs.
std::string record(const std::string& payload) {
  const std::string length = le(payload.size(), 8);
  return length + le(detail::masked_crc32c(length), 4) + payload + le(detail::masked_crc32c(payload), 4);
}

TEST(TfeventsReader, ReadsWhatSummaryWriterWritesAsThePythonReaderDoes) {
  testing::TempDir dir;
  const std::string path = write_scalars(dir.path());
  const std::vector<Event> events = read_tfevents(path);
  const auto r = testing::run_command(LOCKSTEP_PYTHON " " LOCKSTEP_SOURCE_DIR "/tests/python/read_tfevents.py '" + path + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto python = nlohmann::json::parse(testing::last_json_line(r.output));

  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_TRUE(events[0].scalars.empty());
  ASSERT_EQ(python["scalars"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const Event& e = events[i + 1];
    ASSERT_EQ(e.scalars.size(), 1u);
    EXPECT_EQ(e.scalars[0].tag, python["scalars"][i]["tag"].get<std::string>());
    EXPECT_EQ(e.scalars[0].value, python["scalars"][i]["value"].get<float>());
    EXPECT_EQ(e.step, python["scalars"][i]["step"].get<int64_t>());
    EXPECT_EQ(e.wall_time, python["scalars"][i]["wall_time"].get<double>());
  }
  EXPECT_EQ(events[3].step, -3);
}

TEST(TfeventsReader, EveryFlippedByteIsCaughtByACrcAndNamed) {
  testing::TempDir dir;
  const std::vector<char> good = read_file(write_scalars(dir.path()));
  const std::string path = dir / "flipped";
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bytes(good.begin(), good.end());
    bytes[i] ^= 0x10;
    write_bytes(path, bytes);
    // Either CRC, or a length that then runs past the end; never a silently different value.
    EXPECT_THAT(error_message([&] { read_tfevents(path); }), AllOf(HasSubstr("'" + path + "'"), HasSubstr("record ")))
        << "byte " << i;
  }
}

TEST(TfeventsReader, TruncatedAndHugeLengthsAreRejectedWithoutAllocating) {
  testing::TempDir dir;
  const std::vector<char> good = read_file(write_scalars(dir.path()));
  const std::string path = dir / "cut";
  write_bytes(path, std::string(good.begin(), good.end() - 3));
  EXPECT_THAT(error_message([&] { read_tfevents(path); }), AllOf(HasSubstr("record 3 at byte"), HasSubstr("truncated")));

  // A length of 2^62 with a valid CRC: refused by comparing with the file's size.
  const std::string length = le(uint64_t{1} << 62, 8);
  write_bytes(path, length + le(detail::masked_crc32c(length), 4) + "abcd");
  EXPECT_THAT(error_message([&] { read_tfevents(path); }),
              AllOf(HasSubstr("record 0 at byte 0"), HasSubstr("claims 4611686018427387904 bytes")));
}

TEST(TfeventsReader, SkipsUnknownFieldsAndRejectsMalformedProtobuf) {
  testing::TempDir dir;
  const std::string path = dir / "events";
  // Event{step=7 (field 2), unknown field 9 (varint 300), summary{value{tag "a", simple_value 2.5,
  // unknown field 4 (bytes)}}}.
  float f = 2.5f;
  uint32_t bits = 0;
  std::memcpy(&bits, &f, 4);
  const std::string value = std::string("\x0a\x01" "a", 3) + "\x15" + le(bits, 4) + "\x22\x02zz";
  const std::string summary = "\x0a" + std::string(1, static_cast<char>(value.size())) + value;
  const std::string event = std::string("\x10\x07\x48\xac\x02", 5) + "\x2a" +
                            std::string(1, static_cast<char>(summary.size())) + summary;
  write_bytes(path, record(event));
  const auto events = read_tfevents(path);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].step, 7);
  ASSERT_EQ(events[0].scalars.size(), 1u);
  EXPECT_EQ(events[0].scalars[0].tag, "a");
  EXPECT_EQ(events[0].scalars[0].value, 2.5f);

  write_bytes(path, record(std::string("\x10\xff\xff", 3)));  // a varint that never ends
  EXPECT_THAT(error_message([&] { read_tfevents(path); }),
              AllOf(HasSubstr("'" + path + "'"), HasSubstr("not an Event protobuf"), HasSubstr("varint")));
  write_bytes(path, record("\x0b"));  // wire type 3 (a group)
  EXPECT_THAT(error_message([&] { read_tfevents(path); }), HasSubstr("wire type 3"));
  write_bytes(path, record(std::string("\x09\x01\x02", 3)));  // a double with 2 of its 8 bytes
  EXPECT_THAT(error_message([&] { read_tfevents(path); }), HasSubstr("8 bytes where 2 remain"));
}

}  // namespace
}  // namespace lockstep::log
