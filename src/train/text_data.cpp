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

namespace lockstep::train {
namespace {

constexpr int64_t kHeldOutEvery = 20;  // entry i is held out when i % 20 == 19
constexpr int64_t kIgnoreIndex = -100;  // cross_entropy's default ignore_index
constexpr int64_t kEvalBatch = 32;      // sequences per evaluation batch
constexpr const char* kTokenizerFile = "tokenizer.json";

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
  if (o.resume().empty()) return "";
  std::error_code ec;
  const fs::path dir = o.resume() == "latest"          ? fs::path(o.checkpoint_dir())
                       : fs::is_directory(o.resume(), ec) ? fs::path(o.resume())
                                                          : fs::path(o.resume()).parent_path();
  const fs::path file = dir / kTokenizerFile;
  return fs::exists(file, ec) ? file.string() : "";
}

std::vector<std::string> read_token_lines(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK_VALUE(in, "--add-tokens '", path, "' cannot be read; give a file with one token per line");
  std::vector<std::string> tokens;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) tokens.push_back(line);
  return tokens;
}

class TextData : public TrainData {
 public:
  explicit TextData(const TrainOptions& o) : o_(o) {
    data::LabelledCorpus corpus = data::read_labelled_corpus(o.text_path());
    std::vector<std::string> train_text, test_text;
    for (size_t i = 0; i < corpus.entries.size(); ++i) {
      if (corpus.entries[i].find_first_not_of(" \t\n\r") == std::string::npos) continue;
      const bool held_out = static_cast<int64_t>(i) % kHeldOutEvery == kHeldOutEvery - 1;
      if (!held_out && o.limit() > 0 && static_cast<int64_t>(train_text.size()) >= o.limit()) continue;
      (held_out ? test_text : train_text).push_back(std::move(corpus.entries[i]));
      (held_out ? test_labels_ : train_labels_).push_back(corpus.labels[i]);
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

  std::shared_ptr<models::Classifier> make_model(const TrainOptions& o, dist::ProcessGroup*,
                                                 bool initial_weights) const override {
    auto model = std::make_shared<models::GptMiniImpl>(
        models::GptMiniOptions(base_vocab_).context(o.max_length()).layers(o.n_layer()).heads(o.n_head())
            .d_model(o.n_embd()).pad_id(pad_id_)
            .num_classes(o.task() == TextTask::kClassify ? num_classes_ : 0));
    if (initial_weights && !o.init_weights().empty()) models::load_state_dict_file(*model, o.init_weights());
    if (tokenizer_->size() != base_vocab_) resize_token_embeddings(*model, tokenizer_->size(), init_);
    return model;
  }

  std::vector<std::vector<int64_t>> micro_batches(int64_t epoch, int64_t replicas, int64_t replica) override {
    std::vector<std::vector<int64_t>> out;
    if (o_.max_tokens() == 0) {
      out = fixed_micro_batches(static_cast<int64_t>(train_.size()), o_.batch_size(), o_.seed(), epoch, replicas, replica);
    } else {
      data::BucketBatchSampler sampler(lengths_, data::BucketBatchSamplerOptions().max_tokens(o_.max_tokens())
                                                     .max_length(o_.max_length()).sort_size(o_.sort_size())
                                                     .num_replicas(replicas).rank(replica).seed(o_.seed()));
      sampler.set_epoch(epoch);
      for (const auto& b : sampler.batches()) out.push_back(b.indices);
    }
    padding_ = padding_fraction(out, lengths_, o_.max_length());
    size_t sequences = 0;
    for (const auto& b : out) sequences += b.size();
    mean_batch_ = out.empty() ? 0.0 : static_cast<double>(sequences) / static_cast<double>(out.size());
    return out;
  }

  std::pair<parallel::MicroBatch, int64_t> micro_batch(const std::vector<int64_t>& indices) const override {
    return batch(train_, train_labels_, indices);
  }

  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const override {
    namespace F = torch::nn::functional;
    if (output.dim() == 2) return F::cross_entropy(output, target);  // classify: (B, classes), (B)
    // lm: (B, T, V), (B, T) -> the mean over the real target tokens
    return F::cross_entropy(output.reshape({-1, output.size(-1)}), target.reshape({-1}),
                            F::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex));
  }

  Evaluation evaluate(torch::nn::Module& module, const ForwardFunction& forward,
                      dist::ProcessGroup* group) const override {
    torch::NoGradGuard no_grad;
    const bool was_training = module.is_training();
    module.eval();
    const int64_t n = static_cast<int64_t>(test_.size());
    const int64_t rank = group ? group->rank() : 0, world = group ? group->size() : 1;
    // [summed loss or correct answers, tokens or sequences]
    torch::Tensor sums = torch::zeros({2}, torch::kDouble);
    for (int64_t start = n * rank / world, end = n * (rank + 1) / world; start < end; start += kEvalBatch) {
      std::vector<int64_t> idx;
      for (int64_t i = start; i < std::min(start + kEvalBatch, end); ++i) idx.push_back(i);
      auto [mb, count] = batch(test_, test_labels_, idx);
      const torch::Tensor out = forward(mb.input).to(torch::kFloat);
      const double value = lm() ? loss(out, mb.target).item<double>() * static_cast<double>(count)
                                : static_cast<double>(out.argmax(1).eq(mb.target).sum().item<int64_t>());
      sums[0] += value;
      sums[1] += count;
    }
    module.train(was_training);
    if (group) group->all_reduce(sums);
    Evaluation e;
    const double mean = sums[0].item<double>() / sums[1].item<double>();
    if (lm()) {
      e.loss = mean;
      e.perplexity = std::exp(mean);
    } else {
      e.accuracy = mean;
    }
    return e;
  }

  void save_beside_checkpoints(const std::string& dir) const override {
    tokenizer_->save((std::filesystem::path(dir) / kTokenizerFile).string());
  }

  std::vector<std::pair<std::string, double>> figures() const override {
    std::vector<std::pair<std::string, double>> f{{"padding_fraction", padding_},
                                                  {"mean_batch_sequences", mean_batch_},
                                                  {"vocab_size", static_cast<double>(tokenizer_->size())}};
    if (lm()) f.emplace_back("unigram_perplexity", unigram_);
    return f;
  }

 private:
  bool lm() const { return o_.task() == TextTask::kLm; }

  void load_tokenizer(const std::vector<std::string>& train_text) {
    const std::string resumed = resumed_tokenizer(o_);
    if (!o_.tokenizer().empty()) {
      tokenizer_ = std::make_unique<data::Tokenizer>(data::Tokenizer::load(o_.tokenizer()));
    } else if (!resumed.empty()) {
      tokenizer_ = std::make_unique<data::Tokenizer>(data::Tokenizer::load(resumed));
    } else {
      tokenizer_ = std::make_unique<data::Tokenizer>(data::train_tokenizer(
          train_text, data::TokenizerTrainerOptions().vocab_size(o_.vocab_size())
                          .special_tokens(std::vector<std::string>{"<|endoftext|>", "<pad>"}),
          "the training split of '" + o_.text_path() + "'"));
    }
    eos_id_ = ensure_special(*tokenizer_, {"<|endoftext|>", "[SEP]"});
    pad_id_ = ensure_special(*tokenizer_, {"<pad>", "[PAD]"});
    base_vocab_ = tokenizer_->size();
    if (!o_.add_tokens().empty()) tokenizer_->add_tokens(read_token_lines(o_.add_tokens()));
    init_ = models::parse_embedding_init(o_.init_new_embeddings(), *tokenizer_);
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

  // input (B, T) int64 padded with <pad>; target (B, T) next tokens with -100 at padding (lm), or
  // (B) categories (classify). Counts target tokens (lm) or sequences.
  std::pair<parallel::MicroBatch, int64_t> batch(const std::vector<std::vector<int64_t>>& seqs,
                                                 const std::vector<int64_t>& labels,
                                                 const std::vector<int64_t>& indices) const {
    const int64_t shift = lm() ? 1 : 0, B = static_cast<int64_t>(indices.size());
    int64_t T = 0;
    for (int64_t i : indices) T = std::max<int64_t>(T, std::min<int64_t>(seqs[i].size() - shift, o_.max_length()));
    torch::Tensor input = torch::full({B, T}, pad_id_, torch::kLong);
    torch::Tensor target = lm() ? torch::full({B, T}, kIgnoreIndex, torch::kLong) : torch::empty({B}, torch::kLong);
    auto in = input.accessor<int64_t, 2>();
    int64_t count = lm() ? 0 : B;
    for (int64_t b = 0; b < B; ++b) {
      const auto& s = seqs[indices[b]];
      const int64_t len = std::min<int64_t>(s.size() - shift, o_.max_length());
      for (int64_t t = 0; t < len; ++t) in[b][t] = s[t];
      if (lm()) {
        auto tg = target.accessor<int64_t, 2>();
        for (int64_t t = 0; t < len; ++t) tg[b][t] = s[t + 1];
        count += len;
      } else {
        target[b] = labels[indices[b]];
      }
    }
    return {{input, target}, count};
  }

  const TrainOptions& o_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  models::EmbeddingInit init_;
  int64_t base_vocab_ = 0, eos_id_ = -1, pad_id_ = -1, num_classes_ = 0;
  std::vector<std::vector<int64_t>> train_, test_;
  std::vector<int64_t> train_labels_, test_labels_;
  std::vector<int64_t> lengths_;  // per training sequence
  double unigram_ = NAN;
  double padding_ = NAN;     // of the last epoch's micro-batches on this rank
  double mean_batch_ = NAN;  // their mean number of sequences
};

}  // namespace

std::unique_ptr<TrainData> make_text_data(const TrainOptions& o, dist::ProcessGroup*) {
  return std::make_unique<TextData>(o);
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
