#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "targets.h"

namespace lockstep::fuzz {
namespace {

// One directory per process, so that parallel fuzzers (-jobs) and test runs never share a file.
class InputDir {
 public:
  InputDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "lockstep-fuzz-XXXXXX").string();
    TORCH_CHECK(::mkdtemp(pattern.data()) != nullptr, "fuzz: cannot create a directory from '",
                pattern, "': ", std::strerror(errno), " (set TMPDIR to a writable directory)");
    path_ = pattern;
  }
  ~InputDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const std::string& input_dir() {
  static const InputDir dir;
  return dir.path();
}

}  // namespace

void expect_names_file(const std::string& message, const std::string& path) {
  if (message.find(path) == std::string::npos)
    throw Violation("the error does not name the file '" + path + "': " + message);
}

std::string input_path(const std::string& name) { return input_dir() + "/" + name; }

std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = input_path(name);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  TORCH_CHECK(f != nullptr, "fuzz: cannot create '", path, "': ", std::strerror(errno));
  const size_t written = size == 0 ? 0 : std::fwrite(data, 1, size, f);
  const bool closed = std::fclose(f) == 0;
  TORCH_CHECK(written == size && closed, "fuzz: writing '", path, "' failed: ", std::strerror(errno));
  return path;
}

}  // namespace lockstep::fuzz
