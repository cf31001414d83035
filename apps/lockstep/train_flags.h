#pragma once
// The flags `lockstep train` and `lockstep plan` share: both describe one run (train::TrainOptions).

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "lockstep/core/names.h"
#include "lockstep/train/options.h"

namespace lockstep::cli {

// An option whose values are an enum's names (its one list, see core/names.h); `set` gets the enum.
template <typename Enum, typename Set>
CLI::Option* add_enum_option(CLI::App* cmd, const std::string& flag, const std::vector<std::string>& names, Set set,
                             const std::string& help, const std::string& default_name) {
  return cmd
      ->add_option_function<std::string>(
          flag, [names, set](const std::string& v) { set(enum_from_name<Enum>(names, v, "value")); },
          help)
      ->check(CLI::IsMember(names))
      ->default_str(default_name);
}

// "text:FILE" or one of data_source_names() but "text"; throws c10::ValueError for "text" alone.
void parse_data(const std::string& text, train::TrainOptions& o);

// --model, --model-file and --data.
void add_model_options(CLI::App* cmd, const std::shared_ptr<train::TrainOptions>& o);

// --data fortunes / text:FILE: tokenizer, task, batching and embedding options.
void add_text_options(CLI::App* cmd, const std::shared_ptr<train::TrainOptions>& o);

// The library's option names as these flags (see with_flag_names), and `more`.
Wording train_wording(Wording more = {});

}  // namespace lockstep::cli
