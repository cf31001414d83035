#pragma once

#include <string>

namespace lockstep {

// Checks of paths a program will write later, made before any slow work so that a typo fails in
// the first second rather than after a whole training run. Each throws c10::ValueError naming
// `flag` (the option, e.g. "--save-model"), the path and why. An empty path is not checked.

// A file: not a directory, in an existing directory this process may create files in.
void check_output_file(const std::string& flag, const std::string& path);
// A directory the program will fill: created now (as the program would), then checked writable.
void check_output_directory(const std::string& flag, const std::string& path);

}  // namespace lockstep
