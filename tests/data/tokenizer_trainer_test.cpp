// Training on words of any length (Note [Long words in training]).
#include "lockstep/data/tokenizer_trainer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>

namespace lockstep::data {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A 4 MB line of one letter, and 256 kB of random letters, as single words beside ordinary text.
// Before, training spent minutes (a 50 MB word: over 120 s and 2.4 GB) in one quadratic merge
// pass; now such a word trains as pieces of at most kMaxTrainingWordBytes, and still encodes and
// decodes whole.
TEST(TokenizerTrainer, AWordOfMegabytesTrainsInPiecesQuickly) {
  std::mt19937 rng(3);
  std::string random(1 << 18, 'a');
  for (char& c : random) c = static_cast<char>('a' + rng() % 26);
  const std::vector<std::string> corpus{std::string(4 << 20, 'a'), random, "the quick brown fox", "jumps over the dog"};
  for (const auto model : {TokenizerModelKind::kBpe, TokenizerModelKind::kWordPiece}) {
    const auto start = std::chrono::steady_clock::now();
    const Tokenizer t = train_tokenizer(corpus, TokenizerTrainerOptions().model(model).vocab_size(400));
    EXPECT_LT(seconds_since(start), 8.0) << "training";
    EXPECT_EQ(t.size(), 400);
    for (int64_t id = 0; id < t.size(); ++id) EXPECT_LE(t.id_to_token(id).size(), kMaxTrainingWordBytes + 2) << id;
    if (model == TokenizerModelKind::kBpe) {
      const auto encoded = t.encode(corpus[0] + " " + random);
      EXPECT_EQ(t.decode(encoded), corpus[0] + " " + random);
    }
  }
}

// The pieces end on character boundaries: in a word of 2-byte characters after one 1-byte one,
// byte 1,000 falls inside a character, and the cut moves before it. Every token is whole characters.
TEST(TokenizerTrainer, ALongWordIsCutBetweenCharacters) {
  std::string word = "x";
  for (int i = 0; i < 3000; ++i) word += i % 2 ? "\xce\xb2" : "\xce\xb1";  // Greek alpha, beta: BERT keeps them
  const Tokenizer t =
      train_tokenizer({word, word}, TokenizerTrainerOptions().model(TokenizerModelKind::kWordPiece).vocab_size(60));
  EXPECT_GT(t.size(), 20);
  for (int64_t id = 5; id < t.size(); ++id) {
    std::string token = t.id_to_token(id);
    if (token.rfind("##", 0) == 0) token.erase(0, 2);
    ASSERT_FALSE(token.empty());
    const auto first = static_cast<uint8_t>(token.front()), last = static_cast<uint8_t>(token.back());
    EXPECT_NE(first & 0xC0, 0x80) << "starts inside a character: '" << token << "'";
    EXPECT_LT(last, 0xC0) << "ends with the first byte of a character: '" << token << "'";
  }
}

}  // namespace
}  // namespace lockstep::data
