#pragma once
// Checks for numeric command-line options. CLI11's NonNegativeNumber and PositiveNumber take
// "inf" and "nan", print their upper bound as the 309 digits of DBL_MAX, and let an integer that
// overflows int64 through as its largest value; these reject such input and say the rule in words.

#include <CLI/CLI.hpp>

namespace lockstep::cli {

CLI::Validator non_negative_number();  // a finite real >= 0
CLI::Validator positive_number();      // a finite real > 0
CLI::Validator non_negative_count();   // an integer in [0, 2^63 - 1]
CLI::Validator positive_count();       // an integer in [1, 2^63 - 1]

}  // namespace lockstep::cli
