#pragma once

#include <string>
#include <vector>

namespace lockstep {

// Writes `bytes` to `path` so that readers see either the previous file or the complete new one,
// never a torn write: the data goes to a temporary file in the same directory, is fsync'ed, and is
// renamed over `path`; the directory is fsync'ed so the rename survives a crash.
// Throws c10::Error naming the path and the OS error on failure; the previous file is left intact
// and the temporary file removed.
void write_file_atomic(const std::string& path, const std::vector<char>& bytes);

// Reads a whole file. Throws c10::Error naming the path when it cannot be opened or read.
std::vector<char> read_file(const std::string& path);

}  // namespace lockstep
