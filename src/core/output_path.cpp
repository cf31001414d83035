#include "lockstep/core/output_path.h"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace lockstep {
namespace {

namespace fs = std::filesystem;

// Throws naming `flag`, `path` and why, unless `dir` is an existing directory this process may
// create files in.
void check_writable_directory(const std::string& flag, const std::string& path, const fs::path& dir) {
  std::error_code ec;
  const char* why = nullptr;
  if (!fs::exists(dir, ec)) {
    why = "it does not exist";
  } else if (!fs::is_directory(dir, ec)) {
    why = "it is not a directory";
  } else if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    why = std::strerror(errno);
  }
  TORCH_CHECK_VALUE(why == nullptr, flag, " '", path, "': cannot create files in '", dir.string(), "' (", why,
                    "); give a path in a writable directory");
}

}  // namespace

void check_output_file(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  TORCH_CHECK_VALUE(!fs::is_directory(path, ec), flag, " '", path, "' is a directory; give a file path");
  const fs::path parent = fs::path(path).parent_path();
  check_writable_directory(flag, path, parent.empty() ? fs::path(".") : parent);
}

void check_output_directory(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  fs::create_directories(path, ec);
  TORCH_CHECK_VALUE(!ec, flag, " '", path, "': cannot create it (", ec.message(), "); give a path in a writable directory");
  check_writable_directory(flag, path, path);
}

}  // namespace lockstep
