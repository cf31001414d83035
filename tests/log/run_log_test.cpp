#include "lockstep/log/run_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace lockstep::log
