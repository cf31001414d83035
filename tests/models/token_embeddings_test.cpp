#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../test_util.h"
#include "lockstep/data/tokenizer_trainer.h"
#include "lockstep/models/token_embeddings.h"

namespace lockstep::models {
namespace {

GptMiniOptions small(int64_t vocab) { return GptMiniOptions(vocab).context(8).d_model(16).heads(2).layers(1); }

data::Tokenizer tokenizer() {
  return data::train_tokenizer({"the quick brown fox", "the lazy dog", "a quick dog"},
                               data::TokenizerTrainerOptions().vocab_size(280));
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(ResizeTokenEmbeddings, KeepsOldRowsAndInitialisesNewOnesAsChosen) {
  const data::Tokenizer tok = tokenizer();
  const int64_t v = tok.size();
  for (const std::string spec : {"zeros", "mean", "copy:Ġdog", "mean-of:\"quick dog\""}) {
    for (bool tie : {true, false}) {
      torch::manual_seed(0);
      GptMini model(small(v).tie_embeddings(tie));
      const torch::Tensor old_in = model->wte->weight.clone(), old_out = model->output_embedding_weight().clone();
      const EmbeddingInit init = parse_embedding_init(spec, tok);
      resize_token_embeddings(*model, v + 3, init);
      for (const auto& [w, old] : {std::pair{model->wte->weight, old_in},
                                   std::pair{model->output_embedding_weight(), old_out}}) {
        ASSERT_EQ(w.sizes(), (std::vector<int64_t>{v + 3, 16})) << spec;
        EXPECT_TRUE(torch::equal(w.narrow(0, 0, v), old)) << spec << ": old rows changed";
        torch::Tensor want;
        if (spec == std::string("zeros")) want = torch::zeros({16});
        if (spec == std::string("mean")) want = old.mean(0);
        if (spec == std::string("copy:Ġdog")) want = old[tok.token_to_id("Ġdog")];
        if (spec == std::string("mean-of:\"quick dog\""))
          want = old.index_select(0, torch::tensor(tok.encode("quick dog"))).mean(0);
        for (int64_t r = v; r < v + 3; ++r) EXPECT_LE(max_diff(w[r], want), 1e-7) << spec << " row " << r;
      }
      EXPECT_EQ(model->options().vocab_size(), v + 3);
      EXPECT_EQ(model->forward(torch::tensor({{v + 2, int64_t{1}}}, torch::kLong)).size(-1), v + 3);
      EXPECT_EQ(model->parameters().size(), tie ? 2u + 12u + 2u : 3u + 12u + 2u);
    }
  }
}

TEST(ResizeTokenEmbeddings, ParsingNamesTheSpecAndTheFix) {
  const data::Tokenizer tok = tokenizer();
  const std::string bad = testing::error_message([&] { parse_embedding_init("random", tok); });
  EXPECT_NE(bad.find("'random' is not an initialiser: choose zeros, mean, copy:<token>"), std::string::npos) << bad;
  const std::string missing = testing::error_message([&] { parse_embedding_init("copy:zebra", tok); });
  EXPECT_NE(missing.find("the tokenizer has no token 'zebra'"), std::string::npos) << missing;
  const std::string empty = testing::error_message([&] { parse_embedding_init("mean-of:\"\"", tok); });
  EXPECT_NE(empty.find("encodes to no tokens"), std::string::npos) << empty;
  GptMini model(small(tok.size()));
  const std::string beyond = testing::error_message(
      [&] { resize_token_embeddings(*model, tok.size() + 1, {EmbeddingInitKind::kCopy, {tok.size()}}); });
  EXPECT_NE(beyond.find("is not one of the model's"), std::string::npos) << beyond;
}

}  // namespace
}  // namespace lockstep::models
