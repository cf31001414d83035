#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "../test_util.h"
#include "lockstep/models/gpt_mini.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/parallel/checkpoint.h"

namespace lockstep::models {
namespace {

GptMiniOptions small(int64_t vocab = 50) { return GptMiniOptions(vocab).context(16).d_model(32).heads(4).layers(2); }

std::vector<std::string> keys(const torch::nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [k, v] : state_dict(m)) out.push_back(k);
  return out;
}

// Two rows, the second right-padded with pad id 0: (2, 6).
torch::Tensor padded_ids() { return torch::tensor({{5, 9, 13, 2, 7, 11}, {8, 3, 4, 0, 0, 0}}, torch::kLong); }

TEST(GptMini, StateDictKeysFollowGpt2sNamesAndTiedHasNoLmHead) {
  GptMini tied(small());
  const auto k = keys(*tied);
  EXPECT_EQ(k.front(), "wte.weight");
  EXPECT_EQ(k[1], "wpe.weight");
  EXPECT_EQ(k[2], "h.0.ln_1.weight");
  EXPECT_EQ(k[4], "h.0.attn.c_attn.weight");
  EXPECT_EQ(k.back(), "ln_f.bias");
  EXPECT_EQ(std::count(k.begin(), k.end(), "lm_head.weight"), 0);
  GptMini untied(small().tie_embeddings(false));
  EXPECT_EQ(keys(*untied).back(), "lm_head.weight");
}

TEST(GptMini, LogitsOfARealTokenDoNotDependOnLaterTokensOrPadding) {
  torch::manual_seed(0);
  GptMini model(small().pad_id(0));
  model->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = padded_ids();
  const torch::Tensor full = model->forward(ids);  // (2, 6, 50)
  ASSERT_EQ(full.sizes(), (std::vector<int64_t>{2, 6, 50}));
  // Causal: the first three positions of row 1 alone give the same logits.
  const torch::Tensor alone = model->forward(ids.narrow(0, 1, 1).narrow(1, 0, 3));
  EXPECT_LE((alone[0] - full[1].narrow(0, 0, 3)).abs().max().item<double>(), 1e-5);
  // Left padding: the real tokens (positions 2..4) never attend to the padding, so changing the
  // padding token's embedding leaves their hidden states, and so every logit but the padding
  // token's own (column 0 of the tied output layer), unchanged.
  const torch::Tensor left = torch::tensor({{0, 0, 8, 3, 4}}, torch::kLong);
  const torch::Tensor before = model->forward(left).narrow(1, 2, 3).narrow(-1, 1, 49);
  model->wte->weight[0].normal_();
  const torch::Tensor after = model->forward(left).narrow(1, 2, 3).narrow(-1, 1, 49);
  EXPECT_TRUE(torch::isfinite(after).all().item<bool>());
  EXPECT_LE((before - after).abs().max().item<double>(), 1e-5);
  // Without a padding id the same change reaches them.
  GptMini unmasked(small());
  for (size_t i = 0; i < model->parameters().size(); ++i) unmasked->parameters()[i].copy_(model->parameters()[i]);
  const torch::Tensor seen = unmasked->forward(left).narrow(1, 2, 3).narrow(-1, 1, 49);
  EXPECT_GT((seen - after).abs().max().item<double>(), 1e-3);
}

TEST(GptMini, RejectsIdsOutsideTheVocabularyAndTooLongSequences) {
  GptMini model(small());
  const std::string vocab = testing::error_message([&] { model->forward(torch::tensor({{1, 50}}, torch::kLong)); });
  EXPECT_NE(vocab.find("token id 50 is outside the vocabulary [0, 50)"), std::string::npos) << vocab;
  const std::string length = testing::error_message([&] { model->forward(torch::zeros({1, 17}, torch::kLong)); });
  EXPECT_NE(length.find("17 tokens is longer than the model's context of 16"), std::string::npos) << length;
  const std::string heads = testing::error_message([] { GptMiniOptions(10).d_model(30).heads(4).validate(); });
  EXPECT_NE(heads.find("d_model=30 is not divisible by heads=4"), std::string::npos) << heads;
}

TEST(GptMini, CheckpointedBlocksGiveTheSameLossAndGradients) {
  torch::manual_seed(1);
  GptMini a(small().pad_id(0)), b(small().pad_id(0));
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < a->parameters().size(); ++i) b->parameters()[i].copy_(a->parameters()[i]);
  }
  b->set_block_runner(parallel::checkpoint_block);
  const torch::Tensor ids = padded_ids();
  a->forward(ids).square().mean().backward();
  b->forward(ids).square().mean().backward();
  for (size_t i = 0; i < a->parameters().size(); ++i)
    EXPECT_LE((a->parameters()[i].grad() - b->parameters()[i].grad()).abs().max().item<double>(), 1e-6) << i;
}

// Python's gpt_mini.py loads what we save, strictly, and its logits equal ours: language model
// (tied and untied) and classifier, with padding.
class PythonGptMini : public ::testing::TestWithParam<int> {};

TEST_P(PythonGptMini, LoadsOurStateDictAndGivesOurLogits) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  torch::manual_seed(2);
  GptMiniOptions o = small().pad_id(0);
  if (GetParam() == 1) o.tie_embeddings(false);
  if (GetParam() == 2) o.num_classes(3);
  GptMini model(o);
  model->eval();
  testing::TempDir dir;
  save_state_dict(*model, dir / "model.pt");
  auto r = testing::run_command(python + " " LOCKSTEP_SOURCE_DIR "/tests/python/gpt_mini.py " + (dir / "model.pt") +
                                " 4 0 '[[5,9,13,2,7,11],[8,3,4,0,0,0]]'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(testing::last_json_line(r.output));
  EXPECT_EQ(j["keys"].get<std::vector<std::string>>(), keys(*model));
  torch::NoGradGuard no_grad;
  const torch::Tensor ours = model->forward(padded_ids());
  EXPECT_EQ(j["shape"].get<std::vector<int64_t>>(), ours.sizes().vec());
  const torch::Tensor theirs = torch::tensor(j["logits"].get<std::vector<float>>()).view(ours.sizes());
  // A language model's outputs at padding positions are not Python's (Note [Only real tokens
  // through the linear layers]); every real position's are.
  const torch::Tensor real = GetParam() == 2 ? torch::ones({2}, torch::kBool) : padded_ids().ne(0);
  EXPECT_LE((ours.index({real}) - theirs.index({real})).abs().max().item<double>(), 1e-5);
}

// The padded batch, with the output layer at its real tokens only (packed_logits, training mode):
// the same logits as each row run alone without padding (the dense path), and the same loss and
// gradients as the mean over every row's tokens.
TEST(GptMini, PackedLogitsLossAndGradientsEqualThoseOfEachRowAlone) {
  torch::manual_seed(3);
  GptMini packed(small().pad_id(0).packed_logits(true)), rows(small().pad_id(0));
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < packed->parameters().size(); ++i) rows->parameters()[i].copy_(packed->parameters()[i]);
  }
  const torch::Tensor ids = torch::tensor({{5, 9, 13, 2, 7, 11}, {8, 3, 4, 0, 0, 0}, {6, 1, 0, 0, 0, 0}}, torch::kLong);
  const torch::Tensor target = torch::randint(1, 50, {3, 6}, torch::kLong);
  const torch::Tensor real = ids.ne(0);
  const torch::Tensor logits = packed->forward(ids);  // training mode: (11 real tokens, 50)
  ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{11, 50}));
  torch::nn::functional::cross_entropy(logits, target.masked_select(real)).backward();

  std::vector<torch::Tensor> row_logits;
  torch::Tensor sum = torch::zeros({});
  for (int64_t b = 0; b < ids.size(0); ++b) {
    const torch::Tensor keep = real[b].nonzero().squeeze(1);
    const torch::Tensor out = rows->forward(ids[b].index_select(0, keep).unsqueeze(0))[0];  // (len, 50)
    row_logits.push_back(out);
    sum = sum + torch::nn::functional::cross_entropy(out, target[b].index_select(0, keep),
                                                     torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  }
  (sum / real.sum()).backward();
  EXPECT_LE((logits - torch::cat(row_logits)).abs().max().item<double>(), 1e-5);
  for (size_t i = 0; i < packed->parameters().size(); ++i)
    EXPECT_LE((packed->parameters()[i].grad() - rows->parameters()[i].grad()).abs().max().item<double>(), 1e-6) << i;
  // Evaluation mode: (B, T, V) again, equal at the real positions.
  packed->eval();
  torch::NoGradGuard no_grad;
  EXPECT_LE((packed->forward(ids).index({real}) - logits).abs().max().item<double>(), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Heads, PythonGptMini, ::testing::Values(0, 1, 2));

}  // namespace
}  // namespace lockstep::models
