// Text for the training loop; see Note [Text training].
#include "lockstep/train/text_data.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "lockstep/data/bucket_batch_sampler.h"
#include "lockstep/data/text_corpus.h"
#include "lockstep/data/tokenizer_trainer.h"
#include "lockstep/models/gpt_mini.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/token_embeddings.h"
#include "reference_data.h"

namespace lockstep::train {
namespace {

constexpr int64_t kHeldOutEvery = 20;  // entry i is held out when i % 20 == 19
constexpr int64_t kIgnoreIndex = -100;  // cross_entropy's default ignore_index
constexpr int64_t kEvalBatch = 32;      // sequences per evaluation batch
constexpr const char* kTokenizerFile = "tokenizer.json";

bool held_out(size_t entry) { return static_cast<int64_t>(entry) % kHeldOutEvery == kHeldOutEvery - 1; }
bool has_text(const std::string& entry) { return entry.find_first_not_of(" \t\n\r") != std::string::npos; }

// The id of the first of `names` the tokenizer has; else `names[0]`, added as a special token.
int64_t ensure_special(data::Tokenizer& tokenizer, const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (tokenizer.token_to_id(n) >= 0) return tokenizer.token_to_id(n);
  tokenizer.add_special_tokens(std::vector<std::string>{names[0]});
  return tokenizer.token_to_id(names[0]);
}

// The tokenizer saved beside the checkpoints `o` resumes from, "" when there is none.
std::string resumed_tokenizer(const TrainOptions& o) {
  namespace fs = std::filesystem;
  const CheckpointerOptions& c = o.trainer().checkpoint();
  if (c.resume().empty()) return "";
  std::error_code ec;
  const fs::path dir = c.resume() == "latest"          ? fs::path(c.dir())
                       : fs::is_directory(c.resume(), ec) ? fs::path(c.resume())
                                                          : fs::path(c.resume()).parent_path();
  const fs::path file = dir / kTokenizerFile;
  return fs::exists(file, ec) ? file.string() : "";
}

// The corpus of a run, tokenised: both splits, the tokenizer and what the model needs of it.
class TextCorpus {
 public:
  explicit TextCorpus(const TrainOptions& o) : o_(o) {
    // With --limit, reading stops at the limit's last training entry, or at the first held-out
    // one when none came before it (see Note [Text training]).
    int64_t train_seen = 0, test_seen = 0;
    const auto enough = [&](const data::LabelledCorpus& c) {
      const size_t i = c.entries.size() - 1;
      if (has_text(c.entries[i])) ++(held_out(i) ? test_seen : train_seen);
      return o.limit() > 0 && train_seen >= o.limit() && test_seen > 0;
    };
    data::LabelledCorpus corpus = data::read_labelled_corpus(o.text_path(), enough);
    std::vector<std::string> train_text, test_text;
    for (size_t i = 0; i < corpus.entries.size(); ++i) {
      if (!has_text(corpus.entries[i])) continue;
      if (!held_out(i) && o.limit() > 0 && static_cast<int64_t>(train_text.size()) >= o.limit()) continue;
      (held_out(i) ? test_text : train_text).push_back(std::move(corpus.entries[i]));
      (held_out(i) ? test_labels_ : train_labels_).push_back(corpus.labels[i]);
    }
    TORCH_CHECK_VALUE(!train_text.empty() && !test_text.empty(), "the corpus '", o.text_path(), "' has ",
                      train_text.size() + test_text.size(), " non-empty entries; every ", kHeldOutEvery,
                      "th is held out for evaluation, so it needs at least ", kHeldOutEvery, ": give a larger corpus");
    num_classes_ = static_cast<int64_t>(corpus.categories.size());
    TORCH_CHECK_VALUE(o.task() == TextTask::kLm || num_classes_ >= 2, "--task classify: the corpus '", o.text_path(),
                      "' has ", num_classes_, " category; categories are the files of a directory of fortune files ",
                      "(e.g. --data fortunes): give a directory with at least two");
    load_tokenizer(train_text);
    encode(train_text, train_);
    encode(test_text, test_);
  }

  std::shared_ptr<models::Classifier> make_model(bool initial_weights) const {
    auto model = std::make_shared<models::GptMiniImpl>(
        models::GptMiniOptions(base_vocab_).context(o_.max_length()).layers(o_.n_layer()).heads(o_.n_head())
            .d_model(o_.n_embd()).pad_id(pad_id_).packed_logits(true)
            .num_classes(o_.task() == TextTask::kClassify ? num_classes_ : 0));
    if (initial_weights && !o_.init_weights().empty()) {
      try {
        models::load_state_dict_file(*model, o_.init_weights());
      } catch (const c10::Error& e) {
        TORCH_CHECK_VALUE(false, e.what_without_backtrace(), " (the model's ", base_vocab_, " embedding rows are the ids of ",
                          tokenizer_source_, " before --add-tokens: give --init-weights a model trained with it)");
      }
    }
    if (tokenizer_->size() != base_vocab_) resize_token_embeddings(*model, tokenizer_->size(), init_);
    return model;
  }

  bool lm() const { return o_.task() == TextTask::kLm; }
  const TrainOptions& options() const { return o_; }
  const std::vector<std::vector<int64_t>>& sequences(bool train) const { return train ? train_ : test_; }
  const std::vector<int64_t>& lengths() const { return lengths_; }

  // Sequence `i` of a split: input (T) int64, truncated to --max-length; target (T) next tokens
  // (lm) or its category (classify, 0-dim).
  Example get(bool train, int64_t i) const {
    const auto& s = (train ? train_ : test_)[i];
    const int64_t shift = lm() ? 1 : 0;
    const int64_t len = std::min<int64_t>(s.size() - shift, o_.max_length());
    const torch::Tensor input = torch::tensor(std::vector<int64_t>(s.begin(), s.begin() + len), torch::kLong);
    if (lm()) return {input, torch::tensor(std::vector<int64_t>(s.begin() + 1, s.begin() + 1 + len), torch::kLong)};
    return {input, torch::tensor((train ? train_labels_ : test_labels_)[i], torch::kLong)};
  }

  // input (B, T) padded with <pad>; target (B, T) with -100 at padding (lm), or (B) categories.
  Example collate(std::vector<Example> samples) const {
    const auto B = static_cast<int64_t>(samples.size());
    int64_t T = 0;
    for (const Example& e : samples) T = std::max(T, e.data.size(0));
    torch::Tensor input = torch::full({B, T}, pad_id_, torch::kLong);
    torch::Tensor target = lm() ? torch::full({B, T}, kIgnoreIndex, torch::kLong) : torch::empty({B}, torch::kLong);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = samples[b].data.size(0);
      input[b].narrow(0, 0, len).copy_(samples[b].data);
      if (lm()) {
        // A real <pad> in the text is padding to the model (Note [Padding through blocks]): no target.
        target[b].narrow(0, 0, len).copy_(samples[b].target.masked_fill(samples[b].data.eq(pad_id_), kIgnoreIndex));
      } else {
        target[b] = samples[b].target;
      }
    }
    return {input, target};
  }

  // Target tokens (lm) or sequences (classify).
  int64_t count(const Example& batch) const {
    return lm() ? batch.target.ne(kIgnoreIndex).sum().item<int64_t>() : batch.data.size(0);
  }

  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const {
    namespace F = torch::nn::functional;
    if (!lm()) return F::cross_entropy(output, target);  // classify: (B, classes), (B)
    if (output.dim() == 2) {
      // Training: (N, V) at the N real tokens in row-major order (GptMiniOptions::packed_logits).
      const torch::Tensor real = target.masked_select(target.ne(kIgnoreIndex));
      TORCH_CHECK(output.size(0) == real.size(0), "gpt-mini returned logits for ", output.size(0),
                  " tokens but the batch has ", real.size(0), " target tokens");
      return F::cross_entropy(output, real);
    }
    // Evaluation: (B, T, V), (B, T) -> the mean over the real target tokens
    return F::cross_entropy(output.reshape({-1, output.size(-1)}), target.reshape({-1}),
                            F::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex));
  }

  void save_tokenizer(const std::string& dir) const {
    tokenizer_->save((std::filesystem::path(dir) / kTokenizerFile).string());
  }
  int64_t vocab_size() const { return tokenizer_->size(); }
  std::string tokenizer_fingerprint() const { return tokenizer_->fingerprint(); }
  double unigram_baseline() const { return unigram_; }

 private:
  void load_tokenizer(const std::vector<std::string>& train_text) {
    const std::string resumed = resumed_tokenizer(o_);
    if (!o_.tokenizer().empty()) {
      tokenizer_ = std::make_unique<data::Tokenizer>(data::Tokenizer::load(o_.tokenizer()));
      tokenizer_source_ = "--tokenizer '" + o_.tokenizer() + "'";
    } else if (!resumed.empty()) {
      tokenizer_ = std::make_unique<data::Tokenizer>(data::Tokenizer::load(resumed));
      tokenizer_source_ = "'" + resumed + "'";
    } else {
      tokenizer_source_ = "the tokenizer trained on the training split of '" + o_.text_path() + "'";
      tokenizer_ = std::make_unique<data::Tokenizer>(data::train_tokenizer(
          train_text, data::TokenizerTrainerOptions().vocab_size(o_.vocab_size())
                          .special_tokens(std::vector<std::string>{"<|endoftext|>", "<pad>"}),
          "the training split of '" + o_.text_path() + "'"));
    }
    eos_id_ = ensure_special(*tokenizer_, {"<|endoftext|>", "[SEP]"});
    pad_id_ = ensure_special(*tokenizer_, {"<pad>", "[PAD]"});
    base_vocab_ = tokenizer_->size();
    if (!o_.add_tokens().empty()) tokenizer_->add_tokens(data::read_token_file(o_.add_tokens()));
    init_ = models::parse_embedding_init(o_.init_new_embeddings(), *tokenizer_);
    if (!resumed.empty()) check_same_tokenizer(data::Tokenizer::load(resumed), resumed);
  }

  // See Note [Tokenizer fingerprint]: the checkpoints' own record catches any difference; this
  // names the first one when the tokenizer they were trained with is at hand.
  void check_same_tokenizer(const data::Tokenizer& saved, const std::string& saved_path) const {
    if (saved.fingerprint() == tokenizer_->fingerprint()) return;
    std::string difference = saved.size() == tokenizer_->size()
                                 ? "the same tokens, but other merges, added-token flags or settings"
                                 : "its size is " + std::to_string(tokenizer_->size()) + " here but " +
                                       std::to_string(saved.size()) + " there";
    for (int64_t id = 0; id < std::min(saved.size(), tokenizer_->size()); ++id) {
      const std::string here = token_or_hole(*tokenizer_, id), there = token_or_hole(saved, id);
      if (here == there) continue;
      difference = "id " + std::to_string(id) + " is '" + here + "' here but '" + there + "' there";
      break;
    }
    TORCH_CHECK_VALUE(false, "cannot resume: this run's tokenizer (", tokenizer_source_, ", with its special and added ",
                      "tokens) differs from '", saved_path, "', the one the checkpoints were trained with: ", difference,
                      ". Resume with the tokenizer the checkpoints were trained with (leave out --tokenizer to use '",
                      saved_path, "'), or start afresh from the model's weights with --init-weights");
  }
  static std::string token_or_hole(const data::Tokenizer& t, int64_t id) {
    try {
      return t.id_to_token(id);
    } catch (const c10::ValueError&) {
      return "(no token)";
    }
  }

  // lm: <eos> ids <eos>; classify: ids <eos>. lengths_: what the model reads, before truncation.
  void encode(const std::vector<std::string>& text, std::vector<std::vector<int64_t>>& out) {
    const bool train = &out == &train_;
    for (auto& ids : tokenizer_->encode_batch(text)) {
      std::vector<int64_t> seq;
      if (lm()) seq.push_back(eos_id_);
      seq.insert(seq.end(), ids.begin(), ids.end());
      seq.push_back(eos_id_);
      if (train) lengths_.push_back(static_cast<int64_t>(seq.size()) - (lm() ? 1 : 0));
      out.push_back(std::move(seq));
    }
    if (!train && lm()) unigram_ = unigram_perplexity(targets(train_), targets(test_), tokenizer_->size());
  }

  // The tokens a language model predicts: every token of a sequence but the first, truncated.
  std::vector<int64_t> targets(const std::vector<std::vector<int64_t>>& seqs) const {
    std::vector<int64_t> t;
    for (const auto& s : seqs) t.insert(t.end(), s.begin() + 1, s.begin() + std::min<int64_t>(s.size(), o_.max_length() + 1));
    return t;
  }

  const TrainOptions& o_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::string tokenizer_source_;  // where it came from, for errors
  models::EmbeddingInit init_;
  int64_t base_vocab_ = 0, eos_id_ = -1, pad_id_ = -1, num_classes_ = 0;
  std::vector<std::vector<int64_t>> train_, test_;
  std::vector<int64_t> train_labels_, test_labels_;
  std::vector<int64_t> lengths_;  // per training sequence
  double unigram_ = NAN;
};



// One split of the corpus as training data: the training split batches by --batch-size or by
// --max-tokens and reports its padding.
class TextSplit : public TrainingData {
 public:
  TextSplit(std::shared_ptr<const TextCorpus> corpus, bool train) : corpus_(std::move(corpus)), train_(train) {}

  int64_t size() const override { return static_cast<int64_t>(corpus_->sequences(train_).size()); }
  Example get(int64_t index) const override { return corpus_->get(train_, index); }
  Example collate(std::vector<Example> samples) const override { return corpus_->collate(std::move(samples)); }
  int64_t count(const Example& batch) const override { return corpus_->count(batch); }

  std::vector<std::vector<int64_t>> batches(const EpochBatches& epoch) override {
    const TrainOptions& o = corpus_->options();
    std::vector<std::vector<int64_t>> out;
    if (o.max_tokens() == 0) {
      out = sampler_batches(size(), epoch);
    } else {
      data::BucketBatchSampler sampler(corpus_->lengths(), data::BucketBatchSamplerOptions().max_tokens(o.max_tokens())
                                           .max_length(o.max_length()).sort_size(o.sort_size())
                                           .num_replicas(epoch.replicas).rank(epoch.replica).seed(epoch.seed));
      sampler.set_epoch(epoch.epoch);
      for (const auto& b : sampler.batches()) out.push_back(b.indices);
    }
    padding_ = padding_fraction(out, corpus_->lengths(), o.max_length());
    size_t sequences = 0;
    for (const auto& b : out) sequences += b.size();
    mean_batch_ = out.empty() ? 0.0 : static_cast<double>(sequences) / static_cast<double>(out.size());
    return out;
  }

  void save_beside_checkpoints(const std::string& dir) const override { corpus_->save_tokenizer(dir); }

  std::vector<std::pair<std::string, double>> figures() const override {
    std::vector<std::pair<std::string, double>> f{{"padding_fraction", padding_},
                                                  {"mean_batch_sequences", mean_batch_},
                                                  {"vocab_size", static_cast<double>(corpus_->vocab_size())}};
    if (corpus_->lm()) f.emplace_back("unigram_perplexity", corpus_->unigram_baseline());
    return f;
  }

 private:
  std::shared_ptr<const TextCorpus> corpus_;
  bool train_;
  double padding_ = NAN;     // of the last epoch's batches on this rank
  double mean_batch_ = NAN;  // their mean number of sequences
};

}  // namespace

ReferenceData make_text_data(const TrainOptions& o) {
  auto corpus = std::make_shared<const TextCorpus>(o);
  ReferenceData d;
  d.train = std::make_shared<TextSplit>(corpus, /*train=*/true);
  d.test = std::make_shared<TextSplit>(corpus, /*train=*/false);
  d.make_model = [corpus](dist::ProcessGroup*, bool initial_weights) { return corpus->make_model(initial_weights); };
  d.loss = [corpus](const torch::Tensor& output, const torch::Tensor& target) { return corpus->loss(output, target); };
  d.metric = corpus->lm() ? Metric::kPerplexity : Metric::kAccuracy;
  d.eval_batch_size = kEvalBatch;
  d.run_settings.emplace_back("tokenizer", corpus->tokenizer_fingerprint());
  return d;
}

double unigram_perplexity(const std::vector<int64_t>& train, const std::vector<int64_t>& test, int64_t vocab_size) {
  TORCH_CHECK_VALUE(!test.empty() && vocab_size >= 1, "unigram_perplexity needs test tokens and a vocabulary");
  std::vector<double> counts(static_cast<size_t>(vocab_size), 1.0);  // add-one
  for (int64_t t : train) counts[static_cast<size_t>(t)] += 1.0;
  const double total = static_cast<double>(train.size() + static_cast<size_t>(vocab_size));
  double nll = 0.0;
  for (int64_t t : test) nll -= std::log(counts[static_cast<size_t>(t)] / total);
  return std::exp(nll / static_cast<double>(test.size()));
}

double padding_fraction(const std::vector<std::vector<int64_t>>& batches, const std::vector<int64_t>& lengths,
                        int64_t max_length) {
  double real = 0.0, padded = 0.0;
  for (const auto& b : batches) {
    int64_t longest = 0;
    for (int64_t i : b) {
      const int64_t len = std::min(lengths[i], max_length);
      real += static_cast<double>(len);
      longest = std::max(longest, len);
    }
    padded += static_cast<double>(longest) * static_cast<double>(b.size());
  }
  return padded > 0 ? 1.0 - real / padded : 0.0;
}

}  // namespace lockstep::train
