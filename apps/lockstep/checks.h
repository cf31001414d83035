#pragma once
// Checks for numeric command-line options. CLI11's NonNegativeNumber and PositiveNumber take
// "inf" and "nan", print their upper bound as the 309 digits of DBL_MAX, and let an integer that
// overflows int64 through as its largest value; these reject such input and say the rule in words.

#include <CLI/CLI.hpp>

#include <string>
#include <utility>
#include <vector>

namespace lockstep::cli {

CLI::Validator non_negative_number();  // a finite real >= 0
CLI::Validator positive_number();      // a finite real > 0
CLI::Validator non_negative_count();   // an integer in [0, 2^63 - 1]
CLI::Validator positive_count();       // an integer in [1, 2^63 - 1]

// A library error in the command's words. The library names an option by its field: each of
// `wording`'s library spellings ("PipelineOptions::stages") becomes the command's ("--stages"),
// and a bare field ("max_skipped_steps=3") that `cmd` has as a flag (--max-skipped-steps) becomes
// the flag. Only bare names of two words or more are replaced, so that plain words ("epochs",
// "model") stay words.
std::string with_flag_names(const std::string& message, const CLI::App& cmd,
                            const std::vector<std::pair<std::string, std::string>>& wording = {});

}  // namespace lockstep::cli
