#include "lockstep/log/progress.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

namespace lockstep::log {
namespace {

using ::testing::HasSubstr;

TEST(Progress, PlainModePrintsOneLinePerTenthReached) {
  std::ostringstream out;
  Progress p(out, /*terminal=*/false, "epoch 1/1", 1000);
  for (int64_t done = 50; done <= 1000; done += 50) p.update(done, 0.5);
  p.finish();
  const std::string text = out.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 10);
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_THAT(text, HasSubstr("epoch 1/1  10% 100/1000"));
  EXPECT_THAT(text, HasSubstr("epoch 1/1 100% 1000/1000"));
  EXPECT_THAT(text, HasSubstr("loss 0.5000"));
}

TEST(Progress, TerminalModeRedrawsOneLineWithABar) {
  std::ostringstream out;
  Progress p(out, /*terminal=*/true, "epoch 2/3", 100);
  p.update(100, 0.25);  // the final update is always drawn
  p.finish();
  const std::string text = out.str();
  EXPECT_EQ(text.front(), '\r');
  EXPECT_THAT(text, HasSubstr("epoch 2/3 [####################] 100% 100/100"));
  EXPECT_THAT(text, HasSubstr("ETA 00:00"));
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1);
}

}  // namespace
}  // namespace lockstep::log
