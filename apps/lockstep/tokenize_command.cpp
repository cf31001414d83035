// `lockstep tokenize train|encode|decode`: trains a tokenizer to a tokenizer.json, and encodes or
// decodes text with one.
#include <c10/util/StringUtil.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "checks.h"
#include "commands.h"
#include "lockstep/core/names.h"
#include "lockstep/data/text_corpus.h"
#include "lockstep/data/tokenizer.h"
#include "lockstep/data/tokenizer_trainer.h"

namespace lockstep::cli {

namespace {

using data::TextCorpusFormat;

struct TokenizeFlags {
  data::TokenizerTrainerOptions train;
  std::string corpus, out, add_tokens, add_special_tokens, tokenizer, input;
  TextCorpusFormat format = TextCorpusFormat::kLines;
  bool skip_special_tokens = false;
  bool report_time = false;
};

void add_format_option(CLI::App* cmd, const std::shared_ptr<TokenizeFlags>& f) {
  const auto& names = data::text_corpus_format_names();
  cmd->add_option_function<std::string>(
         "--corpus-format",
         [f, names](const std::string& v) { f->format = enum_from_name<TextCorpusFormat>(names, v, "corpus format"); },
         "lines: one entry per line; fortunes: entries between '%' lines, a directory for all its fortune files")
      ->check(CLI::IsMember(names))
      ->default_str("lines");
}

int run_train(const TokenizeFlags& f) {
  const auto corpus = data::read_text_corpus(f.corpus, f.format);
  data::Tokenizer tokenizer = data::train_tokenizer(corpus, f.train, "the corpus '" + f.corpus + "'");
  const int64_t trained = tokenizer.size();
  std::ostringstream added;
  for (const auto& [path, special] : {std::pair{f.add_tokens, false}, std::pair{f.add_special_tokens, true}}) {
    if (path.empty()) continue;
    const auto tokens = data::read_token_file(path);
    const int64_t fresh = special ? tokenizer.add_special_tokens(tokens) : tokenizer.add_tokens(tokens);
    added << ", " << fresh << " new " << (special ? "special " : "") << "tokens from " << path << " (of "
          << tokens.size() << ")";
  }
  tokenizer.save(f.out);
  std::cout << "trained " << enum_name(data::tokenizer_model_names(), f.train.model()) << " on " << corpus.size()
            << " entries: " << trained << " tokens" << added.str() << "; " << tokenizer.size() << " in all -> " << f.out
            << "\n";
  return 0;
}

int run_encode(const TokenizeFlags& f) {
  const auto tokenizer = data::Tokenizer::load(f.tokenizer);
  const auto entries = data::read_text_corpus(f.input, f.format);
  const auto start = std::chrono::steady_clock::now();
  const auto encoded = tokenizer.encode_batch(entries);
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  std::string out;
  size_t tokens = 0;
  for (const auto& ids : encoded) {
    tokens += ids.size();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out += ' ';
      out += std::to_string(ids[i]);
    }
    out += '\n';
  }
  std::cout << out;
  // The same line as tests/tokenizer/oracle.mjs's `time` mode, for bench/tokenize.sh.
  if (f.report_time)
    std::cerr << "{\"seconds\":" << seconds.count() << ",\"texts\":" << entries.size() << ",\"tokens\":" << tokens << "}\n";
  return 0;
}

int run_decode(const TokenizeFlags& f) {
  const auto tokenizer = data::Tokenizer::load(f.tokenizer);
  std::ifstream in(f.input);
  TORCH_CHECK(in, "cannot read '", f.input, "'");
  size_t line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    std::istringstream words(line);
    std::vector<int64_t> ids;
    for (std::string w; words >> w;) {
      size_t used = 0;
      int64_t id = -1;
      try {
        id = std::stoll(w, &used);
      } catch (const std::logic_error&) {
      }
      TORCH_CHECK_VALUE(used == w.size() && used > 0, f.input, ":", line_number, ": '", w, "' is not a token id");
      ids.push_back(id);
    }
    std::cout << tokenizer.decode(ids, f.skip_special_tokens) << "\n";
  }
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("tokenize", "Train a tokenizer (tokenizer.json), or encode and decode text with one");
  cmd->require_subcommand(1);
  auto f = std::make_shared<TokenizeFlags>();

  CLI::App* train = cmd->add_subcommand("train", "Train byte-level BPE or WordPiece on a corpus; write tokenizer.json");
  const auto& models = data::tokenizer_model_names();
  train->add_option_function<std::string>(
           "--model", [f, models](const std::string& v) { f->train.model(enum_from_name<data::TokenizerModelKind>(models, v, "model")); },
           "Tokenizer model: " + c10::Join(", ", models))
      ->check(CLI::IsMember(models))
      ->default_str("bpe");
  train->add_option_function<int64_t>("--vocab-size", [f](int64_t v) { f->train.vocab_size(v); },
                                      "Tokens after training, special tokens included")
      ->check(cli::positive_count())
      ->default_str("8000");
  train->add_option("--corpus", f->corpus, "Text to train on (see --corpus-format)")->required();
  add_format_option(train, f);
  train->add_option("--add-tokens", f->add_tokens, "File of tokens to add after training, one per line");
  train->add_option("--add-special-tokens", f->add_special_tokens,
                    "File of special tokens to add (never split or normalized), one per line");
  train->add_option("--out", f->out, "Where to write the tokenizer.json")->required();

  CLI::App* encode = cmd->add_subcommand("encode", "Print each entry's token ids, space-separated, one line per entry");
  encode->add_option("--tokenizer", f->tokenizer, "tokenizer.json to use")->required();
  encode->add_option("file", f->input, "Text to encode (see --corpus-format)")->required();
  add_format_option(encode, f);
  encode->add_flag("--report-time", f->report_time,
                   "Print the encoding time (one thread; reading and printing excluded) to stderr as JSON");

  CLI::App* decode = cmd->add_subcommand("decode", "Print the text of each line of space-separated token ids");
  decode->add_option("--tokenizer", f->tokenizer, "tokenizer.json to use")->required();
  decode->add_option("file", f->input, "File of token ids, one sequence per line")->required();
  decode->add_flag("--skip-special-tokens", f->skip_special_tokens, "Leave special tokens out of the text");

  return {cmd, [f, train, encode] {
            if (train->parsed()) return run_train(*f);
            if (encode->parsed()) return run_encode(*f);
            return run_decode(*f);
          }};
}

}  // namespace lockstep::cli
