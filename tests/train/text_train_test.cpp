// lockstep train on text (Note [Text training]), in one process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>

#include "../test_util.h"
#include "lockstep/data/text_corpus.h"
#include "lockstep/data/tokenizer.h"
#include "lockstep/train/text_data.h"
#include "lockstep/train/train.h"
#include "text_corpus.h"

namespace lockstep::train {
namespace {

using ::testing::HasSubstr;

// `o` without the progress display, its run's options (a Trainer's) set by `edit`.
TrainOptions quiet(TrainOptions o, const std::function<void(TrainerOptions&)>& edit = {}) {
  o.trainer().progress(nullptr);
  if (edit) edit(o.trainer());
  return o;
}

TrainOptions text_run(const std::string& corpus, int64_t epochs = 1) {
  return quiet(TrainOptions().model("gpt-mini").data(DataSource::kText).text_file(corpus).vocab_size(300)
                   .max_length(32).n_layer(2).n_head(2).n_embd(64)
                   .optimizer(optim::OptimizerOptions(optim::OptimizerKind::kAdamW, 0.0)).lr(3e-3),
               [&](TrainerOptions& t) { t.batch_size(16).seed(1).epochs(epochs); });
}

TEST(TextTrain, LanguageModelBeatsTheUnigramBaselineOnHeldOutText) {
  testing::TempDir dir;
  testing::write_grammar_corpus(dir / "corpus.txt", 400);
  const TrainResult r = train(text_run(dir / "corpus.txt", 2).max_tokens(512));
  ASSERT_EQ(r.epochs.size(), 2u);
  double unigram = NAN, padding = NAN;
  for (const auto& [key, value] : r.figures) {
    if (key == "unigram_perplexity") unigram = value;
    if (key == "padding_fraction") padding = value;
  }
  EXPECT_GT(unigram, 5.0);
  // The grammar leaves about 4-6 choices at a word, so the model ends far below the unigram.
  EXPECT_LT(r.perplexity, 0.6 * unigram) << "perplexity " << r.perplexity << " unigram " << unigram;
  EXPECT_NEAR(r.perplexity, std::exp(r.test_loss), 1e-6 * r.perplexity);
  EXPECT_LT(r.epochs[1].test_loss, r.epochs[0].test_loss);
  EXPECT_TRUE(std::isnan(r.test_acc));
  EXPECT_GE(padding, 0.0);
  EXPECT_LT(padding, 0.2);  // length-bucketed
  EXPECT_THAT(r.summary_json(), HasSubstr("\"perplexity\":"));
}

TEST(TextTrain, ClassifiesFortunesByCategory) {
  if (!std::filesystem::exists(kFortunesDir)) GTEST_SKIP() << "fortunes not installed (scripts/bootstrap)";
  const TrainResult r = train(quiet(TrainOptions().model("gpt-mini").data(DataSource::kFortunes).task(TextTask::kClassify)
                                        .limit(300).vocab_size(400).max_length(32).n_layer(1).n_head(2).n_embd(32),
                                    [](TrainerOptions& t) { t.batch_size(16); }));
  EXPECT_GE(r.test_acc, 0.0);
  EXPECT_LE(r.test_acc, 1.0);
  EXPECT_TRUE(std::isnan(r.perplexity));
  EXPECT_TRUE(std::isfinite(r.final_loss));
}

// Bucketed batches differ in size; a checkpoint's (epoch, micro-batch) still names the same
// batches, so a resumed run ends where the uninterrupted one ends, bit for bit.
TEST(TextTrain, ResumingMidEpochContinuesBitForBit) {
  testing::TempDir dir;
  testing::write_grammar_corpus(dir / "corpus.txt", 200);
  const auto run = text_run(dir / "corpus.txt", 2).max_tokens(256);
  const TrainResult straight = train(quiet(run, [&](TrainerOptions& t) { t.save_model(dir / "straight.pt"); }));
  train(quiet(run, [&](TrainerOptions& t) { t.checkpoint().dir(dir / "ckpt").save_every(5); }));
  // About 15 batches per epoch: step 5 is inside the first, and the resumed run goes through the
  // rest of it and all of the second.
  const int64_t mid = 5;
  ASSERT_GT(straight.steps, 2 * mid);
  char name[64];
  std::snprintf(name, sizeof name, "ckpt/step-%08lld.pt", static_cast<long long>(mid));
  ASSERT_TRUE(std::filesystem::exists(dir / name)) << name;
  EXPECT_TRUE(std::filesystem::exists(dir / "ckpt/tokenizer.json"));
  const TrainResult resumed =
      train(quiet(run, [&](TrainerOptions& t) { t.save_model(dir / "resumed.pt").checkpoint().resume(dir / name); }));
  ASSERT_EQ(static_cast<int64_t>(resumed.step_losses.size()), straight.steps - mid);
  for (size_t i = 0; i < resumed.step_losses.size(); ++i)
    EXPECT_EQ(resumed.step_losses[i], straight.step_losses[mid + i]) << "step " << mid + i + 1;
  auto a = testing::saved_state(dir / "straight.pt"), b = testing::saved_state(dir / "resumed.pt");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
}

// Added tokens grow the vocabulary of a trained model (old rows kept), and a checkpoint of the
// larger model resumes with the tokenizer saved beside it.
TEST(TextTrain, AddedTokensGrowTheModelAndItsCheckpointContinues) {
  testing::TempDir dir;
  testing::write_grammar_corpus(dir / "corpus.txt", 200);
  {
    std::ofstream(dir / "tokens.txt") << "<fox>\n<dog>\n";
  }
  const auto base = text_run(dir / "corpus.txt");
  train(quiet(base, [&](TrainerOptions& t) { t.save_model(dir / "first.pt").checkpoint().dir(dir / "first"); }));
  const data::Tokenizer first = data::Tokenizer::load(dir / "first/tokenizer.json");
  const auto grown = TrainOptions(base).tokenizer(dir / "first/tokenizer.json").init_weights(dir / "first.pt")
                         .add_tokens(dir / "tokens.txt").init_new_embeddings("mean-of:\"the fox\"");
  train(quiet(grown, [&](TrainerOptions& t) { t.epochs(2).save_model(dir / "straight.pt"); }));
  train(quiet(grown, [&](TrainerOptions& t) { t.checkpoint().dir(dir / "second"); }));
  const data::Tokenizer second = data::Tokenizer::load(dir / "second/tokenizer.json");
  EXPECT_EQ(second.size(), first.size() + 2);
  EXPECT_EQ(second.token_to_id("<dog>"), first.size() + 1);
  // The resumed run gets its tokenizer from the checkpoint directory (no --tokenizer), with the
  // added tokens already in it, and the 2-row-larger model loads.
  const TrainResult resumed = train(quiet(base, [&](TrainerOptions& t) {
    t.epochs(2).save_model(dir / "resumed.pt").checkpoint().dir(dir / "second").resume("latest");
  }));
  EXPECT_EQ(resumed.epochs.size(), 1u);
  auto a = testing::saved_state(dir / "straight.pt"), b = testing::saved_state(dir / "resumed.pt");
  ASSERT_EQ(a.front().first, "wte.weight");
  EXPECT_EQ(a.front().second.size(0), first.size() + 2);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
}

// --limit bounds what a run reads: the corpus is read up to the limit's last training entry, so a
// refused line after it is never reached; and a file without newlines is refused at the entry
// limit, naming it. Before, `--data text:/dev/zero --limit 200` read 19 GB in 60 s and went on.
TEST(TextTrain, LimitBoundsWhatIsReadAndAnEndlessEntryIsRefused) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(testing::error_message([&] { train(text_run("/dev/zero").limit(200)); }),
              HasSubstr("the corpus '/dev/zero' line 1 starts an entry longer than 16777216 bytes"));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  testing::TempDir dir;
  testing::write_grammar_corpus(dir / "corpus.txt", 100);
  std::ofstream(dir / "corpus.txt", std::ios::app) << std::string(data::kMaxTextEntryBytes + 1, 'x') << "\n";
  const TrainResult r = train(text_run(dir / "corpus.txt").limit(60));
  EXPECT_TRUE(std::isfinite(r.final_loss));
  EXPECT_THAT(testing::error_message([&] { train(text_run(dir / "corpus.txt")); }),
              HasSubstr("corpus.txt' line 101 starts an entry longer than"));
}

// Note [Tokenizer fingerprint]: a checkpoint records its tokenizer's fingerprint. A resume with a
// tokenizer that has two ids swapped is refused, naming both files and the first id that differs;
// one whose tokenizer.json beside the checkpoints was itself edited is refused by the fingerprint.
// Before, both resumed silently (and trained every swapped id's embedding on the other's text).
TEST(TextTrain, ResumingWithAnotherTokenizerIsRefusedNamingBothFiles) {
  testing::TempDir dir;
  testing::write_grammar_corpus(dir / "corpus.txt", 100);
  const auto run = text_run(dir / "corpus.txt");
  train(quiet(run, [&](TrainerOptions& t) { t.checkpoint().dir(dir / "ckpt"); }));
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(testing::read_text(dir / "ckpt/tokenizer.json"));
  std::string a, b;
  for (const auto& [token, id] : j["model"]["vocab"].items()) {
    if (id == 100) a = token;
    if (id == 101) b = token;
  }
  j["model"]["vocab"][a] = 101;
  j["model"]["vocab"][b] = 100;
  std::ofstream(dir / "swapped.json") << j.dump(2);
  const auto resume = [&](TrainOptions o) {
    return testing::error_message([&] {
      train(quiet(o, [&](TrainerOptions& t) { t.epochs(2).checkpoint().dir(dir / "ckpt").resume("latest"); }));
    });
  };
  const std::string with_flag = resume(TrainOptions(run).tokenizer(dir / "swapped.json"));
  EXPECT_THAT(with_flag, HasSubstr("this run's tokenizer (--tokenizer '" + dir / "swapped.json" + "'"));
  EXPECT_THAT(with_flag, HasSubstr("differs from '" + dir / "ckpt/tokenizer.json" + "'"));
  EXPECT_THAT(with_flag, HasSubstr("id 100 is '" + b + "' here but '" + a + "' there"));
  std::filesystem::copy_file(dir / "swapped.json", dir / "ckpt/tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_THAT(resume(run), ::testing::ContainsRegex("it was written by a different run: tokenizer=[0-9]+ tokens, fnv1a64 "
                                                    "[0-9a-f]{16} in the checkpoint but [0-9]+ tokens, fnv1a64"));
}

// Weights of a model trained with another tokenizer: the error names the tensor and now the
// tokenizer whose size the model took.
TEST(TextTrain, InitWeightsOfAnotherVocabularyNameTheTokenizer) {
  testing::TempDir dir;
  testing::write_grammar_corpus(dir / "corpus.txt", 60);
  train(quiet(text_run(dir / "corpus.txt"), [&](TrainerOptions& t) { t.save_model(dir / "small.pt"); }));
  const std::string e = testing::error_message(
      [&] { train(text_run(dir / "corpus.txt").vocab_size(270).init_weights(dir / "small.pt")); });
  EXPECT_THAT(e, HasSubstr("wte.weight"));
  EXPECT_THAT(e, HasSubstr("embedding rows are the ids of the tokenizer trained on the training split"));
}

TEST(TextTrain, BadInputIsNamedWithTheFix) {
  testing::TempDir dir;
  { std::ofstream(dir / "empty.txt"); }
  EXPECT_THAT(testing::error_message([&] { train(text_run(dir / "empty.txt")); }),
              HasSubstr("holds no entries: it is empty"));
  testing::write_grammar_corpus(dir / "corpus.txt", 100);
  EXPECT_THAT(testing::error_message([&] { train(text_run(dir / "corpus.txt").vocab_size(100)); }),
              HasSubstr("--vocab-size 100"));
  {
    std::ofstream(dir / "bad.json") << "{\"model\": {\"type\": \"BPE\", \"vocab\": ";
  }
  EXPECT_THAT(testing::error_message([&] { train(text_run(dir / "corpus.txt").tokenizer(dir / "bad.json")); }),
              HasSubstr(dir / "bad.json"));
  EXPECT_THAT(testing::error_message([&] { train(text_run(dir / "corpus.txt").max_tokens(16)); }),
              HasSubstr("--max-tokens 16 is smaller than one sequence of --max-length 32 tokens"));
  EXPECT_THAT(testing::error_message([&] { train(text_run(dir / "corpus.txt").model("mlp")); }),
              HasSubstr("do not go together"));
}

// "<pad>" written in the text is the padding token to the model (it attends to none of it), so
// it has no target either: the logits of the real tokens (GptMiniOptions::packed_logits) and the
// targets stay one for one.
TEST(TextTrain, APaddingTokenInTheTextIsNotATarget) {
  testing::TempDir dir;
  testing::write_grammar_corpus(dir / "corpus.txt", 100);
  {
    std::ofstream(dir / "corpus.txt", std::ios::app) << "the <pad> fox sees <pad> the dog.\n<pad>\n";
  }
  const TrainResult r = train(text_run(dir / "corpus.txt"));
  EXPECT_TRUE(std::isfinite(r.final_loss));
  EXPECT_TRUE(std::isfinite(r.test_loss));
}

TEST(TextTrain, UnigramPerplexityAndPaddingFractionFollowTheirDefinitions) {
  // Train counts 3 x id 0, 1 x id 1 over a vocabulary of 4: p = (4, 2, 1, 1) / 8.
  EXPECT_NEAR(unigram_perplexity({0, 0, 0, 1}, {0, 1}, 4), std::exp(-(std::log(0.5) + std::log(0.25)) / 2), 1e-12);
  // Lengths 2, 4, 8 truncated at 6: batches {0, 1} (2 + 4 of 8) and {2} (6 of 6).
  EXPECT_NEAR(padding_fraction({{0, 1}, {2}}, {2, 4, 8}, 6), 1.0 - 12.0 / 14.0, 1e-12);
}

}  // namespace
}  // namespace lockstep::train
