#include "lockstep/log/run_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../test_util.h"

namespace lockstep::log {
namespace {

using ::testing::HasSubstr;

TEST(RunLog, WritesOneJsonObjectPerLineAndAppendsOnlyWhenAsked) {
  testing::TempDir dir;
  {
    RunLog log(RunLogOptions().jsonl(dir / "run.jsonl"));
    log.event({{"event", "step"}, {"loss", 0.5}});
    log.event({{"event", "epoch"}, {"test_acc", 0.25}});
  }
  EXPECT_EQ(testing::read_text(dir / "run.jsonl"), "{\"event\":\"step\",\"loss\":0.5}\n{\"event\":\"epoch\",\"test_acc\":0.25}\n");
  RunLog(RunLogOptions().jsonl(dir / "run.jsonl").append(true)).event({{"event", "resumed"}});
  EXPECT_THAT(testing::read_text(dir / "run.jsonl"), ::testing::EndsWith("0.25}\n{\"event\":\"resumed\"}\n"));
  RunLog(RunLogOptions().jsonl(dir / "run.jsonl")).event({{"event", "fresh"}});
  EXPECT_EQ(testing::read_text(dir / "run.jsonl"), "{\"event\":\"fresh\"}\n");
}

// Other ranks hold an empty RunLog: it writes nothing anywhere and every call is harmless.
TEST(RunLog, AnEmptyLogDoesNothingAndABadPathIsNamed) {
  RunLog nothing;
  nothing.event({{"event", "step"}});
  nothing.scalar("train/loss", 1.0, 3);
  nothing.close();
  EXPECT_THAT(testing::error_message([] { RunLog(RunLogOptions().jsonl("/nonexistent-dir/run.jsonl")); }),
              HasSubstr("cannot open --log-jsonl file '/nonexistent-dir/run.jsonl'"));
}

// A run killed mid-line (or by a full disk before the write was checked) leaves half a line; the
// resumed run removes it instead of appending after it.
TEST(RunLog, AppendingRemovesACutOffLastLine) {
  testing::TempDir dir;
  { std::ofstream(dir / "run.jsonl") << "{\"step\":1}\n{\"step\":2,\"lo"; }
  ::testing::internal::CaptureStderr();
  RunLog(RunLogOptions().jsonl(dir / "run.jsonl").append(true)).event({{"step", 2}});
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr("ended in a cut-off line (13 bytes); removed it"));
  EXPECT_EQ(testing::read_text(dir / "run.jsonl"), "{\"step\":1}\n{\"step\":2}\n");
}

// A full disk: one error, the run goes on, and the file ends with its last complete line. Needs
// root to mount a small tmpfs.
TEST(RunLog, AFullDiskStopsTheLogWithOneErrorAndNoHalfLine) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs";
  testing::TempDir dir;
  const std::string disk = dir / "disk";
  std::filesystem::create_directories(disk);
  auto m = testing::run_command("mount -t tmpfs -o size=8k lockstep-test " + disk);
  if (m.exit_code != 0) GTEST_SKIP() << "cannot mount a tmpfs here: " << m.output;
  struct Unmount {
    std::string path;
    ~Unmount() { testing::run_command("umount -l " + path); }
  } unmount{disk};

  ::testing::internal::CaptureStderr();
  {
    RunLog log(RunLogOptions().jsonl(disk + "/run.jsonl"));
    for (int i = 0; i < 40; ++i) log.event({{"step", i}, {"padding", std::string(500, 'x')}});  // 20 kB > 8 kB
  }
  const std::string errors = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(errors, HasSubstr("--log-jsonl logging stopped: writing to '" + disk + "/run.jsonl' failed: No space left"));
  EXPECT_EQ(errors.find("logging stopped"), errors.rfind("logging stopped")) << "one error, not one per event";
  const std::string text = testing::read_text(disk + "/run.jsonl");
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  std::istringstream lines(text);
  int count = 0;
  for (std::string line; std::getline(lines, line); ++count)
    EXPECT_EQ(nlohmann::json::parse(line).at("step").get<int>(), count);
  EXPECT_GT(count, 0);
  EXPECT_LT(count, 40);
}

}  // namespace
}  // namespace lockstep::log
