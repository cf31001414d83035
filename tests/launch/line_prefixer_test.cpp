#include "lockstep/launch/line_prefixer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include "../test_util.h"

namespace lockstep::launch {
namespace {

// What a LinePrefixer wrote, through a file (a pipe would block past its 64 KiB buffer).
class Capture {
 public:
  Capture() : fd_(::open(dir_.path().c_str(), O_TMPFILE | O_RDWR, 0600)) { EXPECT_GE(fd_, 0); }
  ~Capture() { ::close(fd_); }
  int fd() const { return fd_; }
  std::string text() const {
    std::string out;
    char buf[4096];
    off_t offset = 0;
    for (ssize_t n; (n = ::pread(fd_, buf, sizeof(buf), offset)) > 0; offset += n)
      out.append(buf, static_cast<size_t>(n));
    return out;
  }

 private:
  testing::TempDir dir_;
  int fd_;
};

TEST(LinePrefixer, JoinsPiecesIntoWholePrefixedLines) {
  Capture out;
  LinePrefixer lines("[rank 2] ", out.fd());
  lines.feed("hel");
  lines.feed("lo\nwor");
  lines.feed("ld\n\nlast");
  lines.finish();
  EXPECT_EQ(out.text(), "[rank 2] hello\n[rank 2] world\n[rank 2] \n[rank 2] last\n");
}

// Issue 54 item 11: a 100 MB line came out as 1527 lines of 64 KiB, each looking whole.
TEST(LinePrefixer, AnOverlongLineIsCutOnceMarkedAndTheRestOfItDropped) {
  Capture out;
  LinePrefixer lines("> ", out.fd());
  const std::string head(kMaxLineBytes, 'x');
  lines.feed(head.substr(0, 1000));
  lines.feed(head.substr(1000) + std::string(3 * kMaxLineBytes, 'y'));  // no newline yet
  lines.feed(std::string(10, 'z') + "\nnext\n");
  lines.feed(std::string(kMaxLineBytes + 1, 'w'));
  lines.finish();
  EXPECT_EQ(out.text(), "> " + head + kCutMark + "\n> next\n> " + std::string(kMaxLineBytes, 'w') + kCutMark + "\n");
}

TEST(LinePrefixer, ALineOfExactlyTheBoundIsWhole) {
  Capture out;
  LinePrefixer lines("> ", out.fd());
  lines.feed(std::string(kMaxLineBytes, 'x'));
  lines.feed("\n");
  lines.feed(std::string(kMaxLineBytes, 'y'));
  lines.finish();
  EXPECT_EQ(out.text(), "> " + std::string(kMaxLineBytes, 'x') + "\n> " + std::string(kMaxLineBytes, 'y') + "\n");
}

TEST(LinePrefixer, KeepsTheLastLinesWithoutPrefix) {
  Capture out;
  LinePrefixer lines("[rank 0] ", out.fd(), 2);
  lines.feed("one\ntwo\nthree\nfour");
  EXPECT_THAT(lines.tail(), ::testing::ElementsAre("two", "three"));
  lines.finish();
  EXPECT_THAT(lines.tail(), ::testing::ElementsAre("three", "four"));
}

}  // namespace
}  // namespace lockstep::launch
