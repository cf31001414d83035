#include "lockstep/data/text_corpus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "../test_util.h"
#include "lockstep/data/tokenizer.h"

namespace lockstep::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A token file written on Windows gives the same tokens as one written on Linux: no "\r" on the
// end of a token. Empty lines are skipped.
TEST(TokenFile, CrlfLineEndsGiveTheTokensWithoutCarriageReturns) {
  testing::TempDir dir;
  std::ofstream(dir / "unix.txt", std::ios::binary) << "<fox>\n\n<dog>\n";
  std::ofstream(dir / "windows.txt", std::ios::binary) << "<fox>\r\n\r\n<dog>\r\n";
  EXPECT_THAT(read_token_file(dir / "unix.txt"), ElementsAre("<fox>", "<dog>"));
  EXPECT_THAT(read_token_file(dir / "windows.txt"), ElementsAre("<fox>", "<dog>"));
  // Tokens keep inner blanks; only a line of nothing but blanks is refused.
  std::ofstream(dir / "inner.txt", std::ios::binary) << "New York\n";
  EXPECT_THAT(read_token_file(dir / "inner.txt"), ElementsAre("New York"));
}

TEST(TokenFile, AWhitespaceOnlyLineOrAMissingFileIsRefusedNamingIt) {
  testing::TempDir dir;
  std::ofstream(dir / "blank.txt", std::ios::binary) << "<fox>\n  \n<dog>\n";
  EXPECT_THAT(testing::error_message([&] { read_token_file(dir / "blank.txt"); }),
              HasSubstr("the token file '" + dir / "blank.txt" + "' line 2 holds only whitespace"));
  EXPECT_THAT(testing::error_message([] { read_token_file("/nonexistent/tokens.txt"); }),
              HasSubstr("cannot read the token file '/nonexistent/tokens.txt'"));
}

// `lockstep tokenize train --add-tokens` reads it this way (as `lockstep train --add-tokens` does).
TEST(TokenFile, TokenizeTrainAddsTheTokensOfACrlfFileWithoutCarriageReturns) {
  testing::TempDir dir;
  {
    std::ofstream corpus(dir / "corpus.txt");
    for (int i = 0; i < 40; ++i) corpus << "the quick fox jumps over the lazy dog number " << i << "\n";
    std::ofstream(dir / "added.txt", std::ios::binary) << "<fox>\r\n<dog>\r\n";
  }
  const std::string cli = LOCKSTEP_CLI;
  const auto tokenize = testing::run_command(cli + " tokenize train --model bpe --vocab-size 300 --corpus " +
                                             dir / "corpus.txt" + " --add-tokens " + dir / "added.txt" + " --out " +
                                             dir / "tok.json");
  ASSERT_EQ(tokenize.exit_code, 0) << tokenize.output;
  const Tokenizer t = Tokenizer::load(dir / "tok.json");
  EXPECT_GE(t.token_to_id("<fox>"), 0);
  EXPECT_EQ(t.token_to_id("<fox>\r"), -1);
  const auto missing = testing::run_command(cli + " tokenize train --model bpe --vocab-size 300 --corpus " +
                                            dir / "corpus.txt" + " --add-tokens /nonexistent/added.txt --out " +
                                            dir / "x.json");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_THAT(missing.output, HasSubstr("cannot read the token file '/nonexistent/added.txt'"));
}

// A file with no newline (/dev/zero, a binary file) is one endless entry: reading it holds at most
// kMaxTextEntryBytes of it and refuses it naming the file, the line and the limit. Before, it was
// read whole: `--data text:/dev/zero` read 19 GB in a minute and went on.
TEST(TextCorpus, AnEntryWithoutEndIsRefusedAtTheLimitNamingTheFileAndTheLine) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(testing::error_message([] { read_text_corpus("/dev/zero", TextCorpusFormat::kLines); }),
              HasSubstr("the corpus '/dev/zero' line 1 starts an entry longer than 16777216 bytes"));
  EXPECT_THAT(testing::error_message([] { read_labelled_corpus("/dev/zero"); }), HasSubstr("'/dev/zero' line 1"));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  testing::TempDir dir;
  std::ofstream(dir / "fortunes") << "one\n%\ntwo\nlines\n%\n" << std::string(60, 'x') << "\n" << std::string(60, 'y') << "\n";
  EXPECT_THAT(read_text_corpus(dir / "fortunes", TextCorpusFormat::kFortunes, 1000),
              ElementsAre("one", "two\nlines", std::string(60, 'x') + "\n" + std::string(60, 'y')));
  EXPECT_THAT(testing::error_message([&] { read_text_corpus(dir / "fortunes", TextCorpusFormat::kFortunes, 100); }),
              HasSubstr("fortunes' has an entry (lines 6 to 7 and on) longer than 100 bytes"));
}

// A reader that has enough stops reading: what follows is never read (here a line past the limit
// that would be refused). A directory's files not read are still categories.
TEST(TextCorpus, ReadingStopsWhenTheReaderHasEnough) {
  testing::TempDir dir;
  {
    std::ofstream lines(dir / "lines.txt");
    for (int i = 0; i < 100; ++i) lines << "entry " << i << "\n";
    lines << std::string(200, 'z') << "\n";
  }
  const auto fifty = [](const LabelledCorpus& c) { return c.entries.size() == 50; };
  const LabelledCorpus c = read_labelled_corpus(dir / "lines.txt", fifty, 150);
  EXPECT_EQ(c.entries.size(), 50u);
  EXPECT_EQ(c.entries.back(), "entry 49");
  EXPECT_THAT(testing::error_message([&] { read_labelled_corpus(dir / "lines.txt", {}, 150); }),
              HasSubstr("lines.txt' line 101 starts an entry longer than 150 bytes"));
  std::filesystem::create_directory(dir / "fortunes");
  std::ofstream(dir / "fortunes/art") << "a\n%\nb\n%\nc\n";
  std::ofstream(dir / "fortunes/empty");
  std::ofstream(dir / "fortunes/zen") << "z\n";
  const auto two = [](const LabelledCorpus& c) { return c.entries.size() == 2; };
  const LabelledCorpus f = read_labelled_corpus(dir / "fortunes", two);
  EXPECT_THAT(f.entries, ElementsAre("a", "b"));
  EXPECT_THAT(f.categories, ElementsAre("art", "empty", "zen"));
  EXPECT_THAT(read_labelled_corpus(dir / "fortunes").categories, ElementsAre("art", "zen")) << "read: empty is skipped";
}

}  // namespace
}  // namespace lockstep::data
