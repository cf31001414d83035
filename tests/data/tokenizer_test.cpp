#include "lockstep/data/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../test_util.h"
#include "lockstep/data/pre_tokenizer.h"
#include "lockstep/data/tokenizer_trainer.h"

namespace lockstep::data {
namespace {

using ::testing::HasSubstr;
using testing::error_message;
using V = std::vector<int64_t>;

const std::vector<std::string> kCorpus{
    "The quick brown fox jumps over the lazy dog.", "A bird in the hand is worth two in the bush.",
    "Don't count your chickens before they're hatched!", "  indented line\twith a tab", "Numbers: 12345 and 3.14159",
    "Ünïcödé: naïve café, Straße, 東京, 한국어 — “quotes”", "the the the the fox fox fox"};

Tokenizer train(TokenizerModelKind model, int64_t vocab_size) {
  return train_tokenizer(kCorpus, TokenizerTrainerOptions().model(model).vocab_size(vocab_size));
}

std::vector<std::string> split(PreTokenizerKind kind, const std::string& text) {
  std::vector<std::string_view> words;
  pre_tokenize(kind, text, words);
  return {words.begin(), words.end()};
}

// Expected splits worked out by hand from GPT-2's pattern and BERT's rule (see pre_tokenizer.h).
TEST(PreTokenizer, SplitsAsGpt2PatternAndBertRule) {
  using S = std::vector<std::string>;
  EXPECT_EQ(split(PreTokenizerKind::kByteLevel, "Hello world's  test 123!!\n\n"),
            (S{"Hello", " world", "'s", " ", " test", " 123", "!!", "\n\n"}));
  EXPECT_EQ(split(PreTokenizerKind::kByteLevel, "it'll 'x' ab12 \t x  "), (S{"it", "'ll", " '", "x", "'", " ab", "12", " \t", " x", "  "}));
  EXPECT_EQ(split(PreTokenizerKind::kByteLevel, "naïve 東京"), (S{"naïve", " 東京"}));
  EXPECT_EQ(split(PreTokenizerKind::kBert, " don't  stop-me\tnow! "), (S{"don", "'", "t", "stop", "-", "me", "now", "!"}));
}

// Merges worked out by hand: words "ab", " ab", " ab", " abc" give pair counts a+b 4, Ġ+a 3, b+c 1;
// after a+b, Ġ+ab has 3; after that, Ġab+c has 1.
TEST(Tokenizer, BpeTrainerMergesTheMostFrequentPairFirst) {
  const Tokenizer t = train_tokenizer({"ab ab ab abc"}, TokenizerTrainerOptions().vocab_size(257 + 3).special_tokens(std::vector<std::string>{"<s>"}));
  const auto& bpe = std::get<BpeModel>(t.model());
  using M = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(bpe.merges(), (M{{"a", "b"}, {"Ġ", "ab"}, {"Ġab", "c"}}));
  EXPECT_EQ(t.size(), 260);
  EXPECT_EQ(t.token_to_id("<s>"), 0);
  EXPECT_EQ(t.token_to_id("a"), 1 + 'a');  // the byte alphabet follows the special tokens, in byte order
  EXPECT_EQ(t.encode("ab abc abd"), (V{257, 259, 258, 1 + 'd'}));
}

TEST(Tokenizer, ByteLevelBpeDecodesWhatItEncodesByteForByte) {
  const Tokenizer t = train(TokenizerModelKind::kBpe, 400);
  for (const std::string text : {"The quick brown fox.", "  two  spaces\n\nand\ttabs ", "naïve café 東京 😀", "\x01\x7f control"})
    EXPECT_EQ(t.decode(t.encode(text)), text);
  EXPECT_EQ(t.encode(""), V{});
}

TEST(Tokenizer, WordPieceLowercasesSplitsPiecesAndMarksUnknownWords) {
  const Tokenizer t = train(TokenizerModelKind::kWordPiece, 200);
  const V ids = t.encode("THE Quick, fox!");
  std::vector<std::string> tokens;
  for (const int64_t id : ids) tokens.push_back(t.id_to_token(id));
  EXPECT_EQ(t.decode(ids), "the quick, fox!");
  EXPECT_EQ(tokens.front(), "the");
  EXPECT_EQ(t.encode("ωω ψψ"), (V{t.token_to_id("[UNK]"), t.token_to_id("[UNK]")}));  // no Greek in the corpus
  EXPECT_EQ(t.decode(t.encode("café")), "cafe");  // accents stripped
}

// See Note [Added tokens].
TEST(Tokenizer, AddTokensCountsOnlyNewIdsAndMatchesThemWhole) {
  Tokenizer t = train(TokenizerModelKind::kBpe, 400);
  const int64_t before = t.size();
  const int64_t the = t.token_to_id("the");
  ASSERT_GE(the, 0);
  EXPECT_EQ(t.add_tokens({"xyzzy", "plugh", "", "xyzzy", "the"}), 2);  // empty, repeated and model tokens are not new
  EXPECT_EQ(t.size(), before + 2);
  EXPECT_EQ(t.token_to_id("xyzzy"), before);
  EXPECT_EQ(t.token_to_id("the"), the);
  EXPECT_EQ(t.add_tokens({"plugh"}), 0);
  EXPECT_EQ(t.encode("axyzzyb"), (V{1 + 'a', before, 1 + 'b'}));  // matched before the model splits the text
  EXPECT_EQ(t.decode(t.encode("say xyzzy plugh")), "say xyzzy plugh");
  EXPECT_EQ(t.add_special_tokens({"<|pad|>", "<|endoftext|>"}), 1);
  EXPECT_EQ(t.encode("a<|pad|>"), (V{1 + 'a', before + 2}));
  EXPECT_EQ(t.decode({1 + 'a', before + 2, 0}, /*skip_special_tokens=*/true), "a");
}

TEST(Tokenizer, SpecialTokensAreNeitherNormalizedNorSplitButAddedTokensAreNormalized) {
  Tokenizer t = train(TokenizerModelKind::kWordPiece, 200);
  const int64_t mask = t.token_to_id("[MASK]");
  EXPECT_EQ(t.encode("[MASK]"), V{mask});
  EXPECT_NE(t.encode("[mask]"), V{mask});  // lower case is not the special token
  EXPECT_EQ(t.add_special_tokens({"<Sep>"}), 1);
  EXPECT_EQ(t.encode("a<Sep>b"), (V{t.token_to_id("a"), t.token_to_id("<Sep>"), t.token_to_id("b")}));
  EXPECT_EQ(t.add_tokens({"LockStep"}), 1);  // normalized: its lower case is matched in lower-cased text
  EXPECT_EQ(t.encode("LOCKSTEP lockstep"), (V{t.token_to_id("LockStep"), t.token_to_id("LockStep")}));
}

TEST(Tokenizer, SavedFileLoadsToTheSameTokenizer) {
  testing::TempDir dir;
  for (const auto model : {TokenizerModelKind::kBpe, TokenizerModelKind::kWordPiece}) {
    Tokenizer t = train(model, 300);
    t.add_tokens({"Zaphod"});
    t.add_special_tokens({"<sep>"});
    t.save(dir / "tokenizer.json");
    const Tokenizer loaded = Tokenizer::load(dir / "tokenizer.json");
    EXPECT_EQ(loaded.to_json(), t.to_json());
    for (const auto& text : kCorpus) EXPECT_EQ(loaded.encode(text + " Zaphod<sep>"), t.encode(text + " Zaphod<sep>"));
  }
}

TEST(Tokenizer, BadInputGetsErrorsNamingTheProblem) {
  EXPECT_THAT(error_message([] { train_tokenizer({}, {}); }), HasSubstr("is empty"));
  EXPECT_THAT(error_message([] { train_tokenizer({"", "  \n"}, {}, "the corpus 'x.txt'"); }),
              HasSubstr("the corpus 'x.txt' is empty"));
  EXPECT_THAT(error_message([] { train_tokenizer(kCorpus, TokenizerTrainerOptions().vocab_size(100)); }),
              HasSubstr("--vocab-size 100 is smaller than the byte alphabet (256 tokens) plus 1 special token(s); byte-level BPE needs at least 257"));
  EXPECT_THAT(error_message([] { train_tokenizer(kCorpus, TokenizerTrainerOptions().model(TokenizerModelKind::kWordPiece).vocab_size(10)); }),
              HasSubstr("vocab_size=10 is smaller than the 5 special tokens plus the"));
  testing::TempDir dir;
  const auto write = [&](const std::string& text) {
    std::ofstream(dir / "bad.json") << text;
    return error_message([&] { Tokenizer::load(dir / "bad.json"); });
  };
  const std::string path = dir / "bad.json";
  EXPECT_THAT(write("{\"model\": "), HasSubstr(path + " is not valid JSON"));
  EXPECT_THAT(write("1E400"), HasSubstr(path + " is not valid JSON")) << "nlohmann's out_of_range, found by fuzzing";
  const std::string good = train(TokenizerModelKind::kBpe, 300).to_json();
  std::string unigram = good;
  unigram.replace(unigram.find("\"BPE\""), 5, "\"Unigram\"");
  EXPECT_THAT(write(unigram), HasSubstr(path + ": model.type is 'Unigram'; lockstep reads 'BPE' (byte-level) and 'WordPiece'"));
  std::string no_vocab = good;
  no_vocab.replace(no_vocab.find("\"vocab\""), 7, "\"vocabulary\"");
  EXPECT_THAT(write(no_vocab), HasSubstr(path + ": model.vocab is missing"));
  std::string bad_merge = good;
  bad_merge.replace(bad_merge.find("\"merges\": [") + 11, 0, "\"Ġ nosuchtoken\",");
  EXPECT_THAT(write(bad_merge), HasSubstr("uses a token that is not in the vocabulary: 'nosuchtoken'"));
  EXPECT_THAT(error_message([] { Tokenizer::load("/nonexistent/tokenizer.json"); }), HasSubstr("/nonexistent/tokenizer.json"));
  // An added token's id past the ones the file defines: len(tokenizer) and every embedding resized
  // to it would be that large (std::bad_alloc, naming nothing, for 10^12).
  std::string far_id = good;
  far_id.replace(far_id.find("\"id\": 0"), 7, "\"id\": 1000000000000");
  EXPECT_THAT(write(far_id), HasSubstr(path + ": added_tokens[0].id is 1000000000000, past the ids this file can "
                                       "define (the model's 300 and 1 added token(s)): give it an id below 301"));
  const Tokenizer t = train(TokenizerModelKind::kBpe, 300);
  EXPECT_THAT(error_message([&] { t.decode({5, 300}); }), HasSubstr("token id 300 is not in the vocabulary (ids 0 to 299)"));
}

TEST(TokenizeCommand, TrainsEncodesAndDecodesFiles) {
  testing::TempDir dir;
  {
    std::ofstream corpus(dir / "corpus.txt");
    for (const auto& line : kCorpus) corpus << line << "\n";
    std::ofstream(dir / "added.txt") << "Zaphod\n\nBeeblebrox\n";
  }
  const std::string cli = LOCKSTEP_CLI;
  const auto train = testing::run_command(cli + " tokenize train --model bpe --vocab-size 300 --corpus " + dir / "corpus.txt" +
                                          " --add-tokens " + dir / "added.txt" + " --out " + dir / "tok.json");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  EXPECT_THAT(train.output, HasSubstr("trained bpe on 7 entries: 300 tokens, 2 new tokens from"));
  const auto encode = testing::run_command(cli + " tokenize encode --tokenizer " + dir / "tok.json " + dir / "corpus.txt");
  ASSERT_EQ(encode.exit_code, 0) << encode.output;
  const Tokenizer t = Tokenizer::load(dir / "tok.json");
  std::string expected;
  for (const auto& line : kCorpus) {
    for (const int64_t id : t.encode(line)) expected += std::to_string(id) + " ";
    if (!expected.empty() && expected.back() == ' ') expected.pop_back();
    expected += "\n";
  }
  EXPECT_EQ(encode.output, expected);
  std::ofstream(dir / "ids.txt") << encode.output;
  const auto decode = testing::run_command(cli + " tokenize decode --tokenizer " + dir / "tok.json " + dir / "ids.txt");
  ASSERT_EQ(decode.exit_code, 0) << decode.output;
  EXPECT_EQ(decode.output, testing::read_text(dir / "corpus.txt"));
  const auto bad = testing::run_command(cli + " tokenize train --model bpe --vocab-size 100 --corpus " + dir / "corpus.txt" +
                                        " --out " + dir / "x.json");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.output, HasSubstr("byte-level BPE needs at least 257"));
  const auto model = testing::run_command(cli + " tokenize train --model unigram --corpus " + dir / "corpus.txt" + " --out x");
  EXPECT_EQ(model.exit_code, 2);
  EXPECT_THAT(model.output, HasSubstr("unigram"));
}

}  // namespace
}  // namespace lockstep::data
