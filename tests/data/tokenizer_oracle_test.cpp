// lockstep's tokenizers against an independent implementation: Hugging Face's own `tokenizers`
// (PyPI; the Rust library transformers uses) loads the tokenizer.json lockstep wrote and encodes every entry of the fortunes corpus; the ids must be identical. Each fortune entry (the
// text between '%' lines, inner newlines kept) is one sequence (TextCorpusFormat::kFortunes).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>

#include "../test_util.h"
#include "lockstep/data/text_corpus.h"
#include "lockstep/data/tokenizer.h"
#include "lockstep/data/tokenizer_trainer.h"

namespace lockstep::data {
namespace {

const std::string kFortunes = "/usr/share/games/fortunes";
const std::string kOracleDir = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/tokenizer";

// Texts beyond the corpus: added and special tokens inside words, Unicode the corpus lacks.
const std::vector<std::string> kExtraTexts{
    "Our lockstep<|sep|>Zaphod's computer runs Linux[ENTRY]fortune",
    "[ENTRY] LOCKSTEP Lockstep zaphod <|sep|><|sep|> [entry]",
    "Straße naïve CAFÉ 東京 한국어 Ελληνικά ﬁn ① ½ \u00a0nbsp\u3000ideographic space \u200bzero width",
    "  leading  and trailing  \n\n\t", "emoji 😀👍🏽 and combining e\u0301 and \x07 bell"};

// Hugging Face tokenizers' encoding of `texts` with `tokenizer` (both written to `dir`): {"ids": [[...], ...],
// "decoded": [...]}; no ids when the oracle fails (a test failure).
nlohmann::json encode_with_hf_tokenizers(const Tokenizer& tokenizer, const std::vector<std::string>& texts,
                                         const testing::TempDir& dir) {
  tokenizer.save(dir / "tokenizer.json");
  std::ofstream(dir / "texts.json") << nlohmann::json(texts).dump();
  const auto run = testing::run_command(std::string(LOCKSTEP_PYTHON) + " " + kOracleDir + "/oracle.py encode " +
                                        dir / "tokenizer.json " + dir / "texts.json > " + dir / "oracle.json");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  if (run.exit_code != 0) return {{"ids", nlohmann::json::array()}};
  return nlohmann::json::parse(testing::read_text(dir / "oracle.json"));
}

class TokenizerOracle : public ::testing::TestWithParam<TokenizerModelKind> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kFortunes)) GTEST_SKIP() << "fortunes not installed (scripts/bootstrap)";
    if (testing::run_command(std::string(LOCKSTEP_PYTHON) + " -c 'import tokenizers'").exit_code != 0)
      GTEST_SKIP() << "tokenizers is not installed in the venv (scripts/bootstrap --test)";
  }
};

TEST_P(TokenizerOracle, IdsMatchHfTokenizersOnEveryFortune) {
  const bool bpe = GetParam() == TokenizerModelKind::kBpe;
  std::vector<std::string> texts = read_text_corpus(kFortunes, TextCorpusFormat::kFortunes);
  ASSERT_GT(texts.size(), 10000u);
  Tokenizer tokenizer = train_tokenizer(texts, TokenizerTrainerOptions().model(GetParam()).vocab_size(8000));
  // Some of these are in the trained vocabulary already (counted as not new), some are not.
  const int64_t added = tokenizer.add_tokens({"lockstep", "Zaphod", "fortune", "Linux", "computer", "the"});
  const int64_t special = tokenizer.add_special_tokens({"<|sep|>", "[ENTRY]"});
  EXPECT_GE(added, 2);
  EXPECT_EQ(special, 2);
  texts.insert(texts.end(), kExtraTexts.begin(), kExtraTexts.end());

  testing::TempDir dir;
  const auto oracle = encode_with_hf_tokenizers(tokenizer, texts, dir);
  ASSERT_EQ(oracle["ids"].size(), texts.size());

  const auto ours = tokenizer.encode_batch(texts);
  size_t id_mismatches = 0, decode_mismatches = 0, round_trip_failures = 0, tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto theirs = oracle["ids"][i].get<std::vector<int64_t>>();
    tokens += ours[i].size();
    if (ours[i] != theirs && ++id_mismatches <= 3)
      ADD_FAILURE() << "entry " << i << " differs from tokenizers: '" << texts[i].substr(0, 200) << "'";
    const std::string decoded = tokenizer.decode(ours[i]);
    if (decoded != oracle["decoded"][i].get<std::string>() && ++decode_mismatches <= 3)
      ADD_FAILURE() << "entry " << i << " decodes to '" << decoded << "', tokenizers to '" << oracle["decoded"][i] << "'";
    // Byte-level BPE loses nothing; WordPiece loses case, accents and spacing, so its round trip
    // is decode then encode giving the same ids.
    const bool round_trips = bpe ? decoded == texts[i] : tokenizer.encode(decoded) == ours[i];
    if (!round_trips && ++round_trip_failures <= 3)
      ADD_FAILURE() << "entry " << i << " does not round-trip: '" << texts[i].substr(0, 200) << "' -> '" << decoded << "'";
  }
  EXPECT_EQ(id_mismatches, 0u);
  EXPECT_EQ(decode_mismatches, 0u);
  EXPECT_EQ(round_trip_failures, 0u);
  std::cout << (bpe ? "BPE" : "WordPiece") << ": " << texts.size() << " texts, " << tokens << " tokens, vocabulary "
            << tokenizer.size() << " (" << added << " added, " << special << " special added); " << id_mismatches
            << " id mismatches with tokenizers\n";
}

// Words of tens of thousands of bytes (Note [BPE merges in n log n]; WordPiece maps a word over
// max_input_chars_per_word to [UNK]) encode to the ids tokenizers gives. The scan took ~4 s for each of
// these; both now take milliseconds.
TEST_P(TokenizerOracle, LongWordsEncodeAsHfTokenizersDoes) {
  std::vector<std::string> corpus = read_text_corpus(kFortunes + "/computers", TextCorpusFormat::kFortunes);
  const Tokenizer tokenizer = train_tokenizer(corpus, TokenizerTrainerOptions().model(GetParam()).vocab_size(2000));
  std::mt19937 rng(9);
  std::string letters(30000, 'a'), base64(3000, 'a');
  for (char& c : letters) c = static_cast<char>('a' + rng() % 26);
  const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (char& c : base64) c = alphabet[rng() % alphabet.size()];
  std::string ab;
  for (int i = 0; i < 15000; ++i) ab += "ab";
  const std::vector<std::string> texts{std::string(30000, 'a'), letters, ab, "the " + base64 + " end"};
  testing::TempDir dir;
  const auto oracle = encode_with_hf_tokenizers(tokenizer, texts, dir);
  ASSERT_EQ(oracle["ids"].size(), texts.size());
  const auto ours = tokenizer.encode_batch(texts);
  for (size_t i = 0; i < texts.size(); ++i)
    EXPECT_EQ(ours[i], oracle["ids"][i].get<std::vector<int64_t>>()) << "text " << i << " of " << texts[i].size() << " bytes";
}

INSTANTIATE_TEST_SUITE_P(Models, TokenizerOracle,
                         ::testing::Values(TokenizerModelKind::kBpe, TokenizerModelKind::kWordPiece),
                         [](const auto& info) { return info.param == TokenizerModelKind::kBpe ? "Bpe" : "WordPiece"; });

}  // namespace
}  // namespace lockstep::data
