#include "lockstep/data/text_corpus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace lockstep::data
