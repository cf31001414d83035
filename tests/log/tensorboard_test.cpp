#include "lockstep/log/tensorboard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/resource.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "../test_util.h"

namespace lockstep::log {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// The independent reader's verdict on `path`: exit code and output (JSON on success).
testing::CommandResult read_with_python(const std::string& path) {
  return testing::run_command(LOCKSTEP_PYTHON " " LOCKSTEP_SOURCE_DIR "/tests/python/read_tfevents.py '" +
                              path + "'");
}

nlohmann::json read_events(const std::string& path) {
  const auto r = read_with_python(path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(testing::last_json_line(r.output));
}

TEST(TensorBoard, Crc32cMatchesTheStandardCheckValue) {
  EXPECT_EQ(detail::crc32c("123456789"), 0xE3069283u);  // the catalogued CRC-32C check value
  EXPECT_EQ(detail::crc32c(""), 0u);
}

TEST(SummaryWriter, IndependentReaderSeesEveryScalarExactly) {
  struct Point {
    std::string tag;
    double value;
    int64_t step;
  };
  // Values that float32 cannot hold exactly (0.1, 1e-30) and its extremes (smallest subnormal,
  // largest finite); steps that take one byte, several bytes, and ten bytes (negative) as varints.
  // Inputs, not results of training: their encoding is IEEE-754 and protobuf's, the same on every
  // x86-64 CPU.
  const std::vector<Point> points = {
      {"train/loss", 2.302585092994046, 0},
      {"train/loss", -0.1, 1},
      {"train/lr", 1e-30, 300},
      {"train/samples_per_s", 3.4028234663852886e38, int64_t{1} << 40},
      {"test/accuracy", 1.401298464324817e-45, std::numeric_limits<int64_t>::max()},
      {"amp/loss_scale", 65536.0, -1},
  };
  testing::TempDir dir;
  const double walltime = 1700000000.123456;  // seconds since the epoch
  std::string path;
  {
    SummaryWriter writer(dir.path());
    path = writer.file_path();
    for (const Point& p : points) writer.add_scalar(p.tag, p.value, p.step, walltime + p.step);
  }

  const nlohmann::json events = read_events(path);
  EXPECT_EQ(events["file_version"], "brain.Event:2");
  const auto& scalars = events["scalars"];
  ASSERT_EQ(scalars.size(), points.size()) << events.dump();
  for (size_t i = 0; i < points.size(); ++i) {
    SCOPED_TRACE(points[i].tag + " step " + std::to_string(points[i].step));
    EXPECT_EQ(scalars[i]["tag"].get<std::string>(), points[i].tag);
    EXPECT_EQ(scalars[i]["step"].get<int64_t>(), points[i].step);
    // Exact: simple_value is float32, and the reader prints its exact double widening.
    EXPECT_EQ(scalars[i]["value"].get<double>(),
              static_cast<double>(static_cast<float>(points[i].value)));
    EXPECT_EQ(scalars[i]["wall_time"].get<double>(), walltime + points[i].step);
  }
}

TEST(SummaryWriter, DefaultWallTimeIsNowInUnixSeconds) {
  testing::TempDir dir;
  const auto unix_now = [] {
    const std::chrono::duration<double> since_epoch =
        std::chrono::system_clock::now().time_since_epoch();
    return since_epoch.count();
  };
  const double before = unix_now();
  std::string path;
  {
    SummaryWriter writer(dir.path());
    path = writer.file_path();
    writer.add_scalar("train/loss", 1.0, 7);
  }
  const double after = unix_now();
  const double wall_time = read_events(path)["scalars"][0]["wall_time"].get<double>();
  EXPECT_GE(wall_time, before);
  EXPECT_LE(wall_time, after);
}

TEST(SummaryWriter, CreatesMissingParentsAndNamesTheFileLikeTensorFlow) {
  testing::TempDir dir;
  const std::string log_dir = dir / "runs/exp1";
  SummaryWriter writer(log_dir);
  EXPECT_EQ(writer.log_dir(), log_dir);
  EXPECT_TRUE(std::filesystem::exists(writer.file_path()));
  const std::string name = std::filesystem::path(writer.file_path()).filename();
  EXPECT_THAT(name, StartsWith("events.out.tfevents."));
  std::array<char, 256> host{};
  ::gethostname(host.data(), host.size() - 1);
  EXPECT_THAT(name, HasSubstr(std::string(".") + host.data() + "."));
  EXPECT_EQ(std::filesystem::path(writer.file_path()).parent_path(), log_dir);
}

TEST(SummaryWriter, TwoWritersInOneSecondGetDifferentFiles) {
  testing::TempDir dir;
  SummaryWriter a(dir.path());
  SummaryWriter b(dir.path());
  EXPECT_NE(a.file_path(), b.file_path());
}

// See Note [When SummaryWriter flushes].
TEST(SummaryWriter, HandsRecordsToTheOsEveryMaxQueueRecordsAndOnFlush) {
  testing::TempDir dir;
  SummaryWriter writer(dir.path(), SummaryWriterOptions().max_queue(3).flush_secs(3600));
  const auto size = [&] { return std::filesystem::file_size(writer.file_path()); };
  const auto header_only = size();
  EXPECT_GT(header_only, 0u);  // the file_version record is flushed at once
  writer.add_scalar("a", 1.0, 1);
  writer.add_scalar("a", 2.0, 2);
  EXPECT_EQ(size(), header_only);
  writer.add_scalar("a", 3.0, 3);
  const auto three = size();
  EXPECT_GT(three, header_only);
  writer.add_scalar("a", 4.0, 4);
  EXPECT_EQ(size(), three);
  writer.flush();
  EXPECT_GT(size(), three);
  EXPECT_EQ(read_events(writer.file_path())["scalars"].size(), 4u);
}

TEST(SummaryWriter, ReaderRejectsACorruptedByte) {
  testing::TempDir dir;
  std::string path;
  {
    SummaryWriter writer(dir.path());
    path = writer.file_path();
    writer.add_scalar("train/loss", 0.5, 1);
  }
  ASSERT_EQ(read_with_python(path).exit_code, 0);
  const auto pristine = testing::read_text(path);
  const auto flip_and_read = [&](size_t offset) {
    std::string bytes = pristine;
    bytes[offset] ^= 0x01;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return read_with_python(path);
  };
  // The last record: 8 length bytes, 4 CRC, payload, 4 CRC. Flip a byte inside its payload, then
  // one of the first record's length bytes.
  auto r = flip_and_read(pristine.size() - 6);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("record 1"));
  EXPECT_THAT(r.output, HasSubstr("data CRC mismatch"));
  r = flip_and_read(0);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("record 0 at byte 0: length CRC mismatch"));
}

TEST(SummaryWriter, UncreatableLogDirErrorNamesThePathAndTheCause) {
  testing::TempDir dir;
  std::ofstream(dir / "file") << "not a directory";
  const std::string log_dir = dir / "file/runs";  // fails even for root, unlike a chmod'ed dir
  const std::string message = testing::error_message([&] { SummaryWriter writer(log_dir); });
  EXPECT_THAT(message, HasSubstr("cannot create log directory '" + log_dir + "'"));
  EXPECT_THAT(message, HasSubstr("Not a directory"));
}

TEST(SummaryWriter, WriteFailureErrorNamesThePathAndTheCause) {
  testing::TempDir dir;
  SummaryWriter writer(dir.path(), SummaryWriterOptions().max_queue(1 << 20));
  // Stand-in for a full disk: a file-size limit makes write(2) fail with EFBIG (once SIGXFSZ,
  // which would kill us, is ignored). Both are restored before any assertion prints.
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto saved_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit limited = saved;
  limited.rlim_cur = 64 * 1024;  // bytes
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  const std::string message = testing::error_message([&] {
    for (int64_t step = 0; step < 10000; ++step) writer.add_scalar("train/loss", 0.5, step);
    writer.flush();
  });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, saved_handler);
  EXPECT_THAT(message, HasSubstr("writing '" + writer.file_path() + "' failed"));
  EXPECT_THAT(message, HasSubstr(std::strerror(EFBIG)));
}

}  // namespace
}  // namespace lockstep::log
