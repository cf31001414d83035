#include "lockstep/core/atomic_file.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace lockstep {
namespace {

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Closes the descriptor and removes the temporary file unless the write was committed.
struct PendingFile {
  std::string path;
  int fd = -1;
  bool committed = false;
  ~PendingFile() {
    if (fd >= 0) ::close(fd);
    if (!committed) ::unlink(path.c_str());
  }
};

}  // namespace

void write_file_atomic(const std::string& path, const std::vector<char>& bytes) {
  PendingFile tmp;
  tmp.path = path + ".tmp." + std::to_string(::getpid());
  tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TORCH_CHECK(tmp.fd >= 0, "cannot write '", path, "': creating '", tmp.path, "' failed: ",
              std::strerror(errno), " (check that the directory exists and is writable)");

  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(tmp.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n > 0, "cannot write '", path, "': writing ", bytes.size(), " bytes to '", tmp.path,
                "' failed after ", done, " bytes: ", std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  TORCH_CHECK(::fsync(tmp.fd) == 0, "cannot write '", path, "': fsync of '", tmp.path,
              "' failed: ", std::strerror(errno));
  int fd = tmp.fd;
  tmp.fd = -1;
  TORCH_CHECK(::close(fd) == 0, "cannot write '", path, "': closing '", tmp.path,
              "' failed: ", std::strerror(errno));
  TORCH_CHECK(::rename(tmp.path.c_str(), path.c_str()) == 0, "cannot write '", path,
              "': renaming '", tmp.path, "' over it failed: ", std::strerror(errno));
  tmp.committed = true;

  // Without this the rename may be lost on power failure even though the data was synced.
  int dir = ::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

std::vector<char> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "cannot read '", path, "': ", std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  TORCH_CHECK(::fstat(fd, &st) == 0, "cannot read '", path, "': ", std::strerror(errno));
  // open() succeeds on a directory and read() then fails with EISDIR; say so in words.
  TORCH_CHECK(!S_ISDIR(st.st_mode), "cannot read '", path,
              "': it is a directory, not a file; give the path of a file");
  std::vector<char> bytes;
  if (S_ISREG(st.st_mode)) bytes.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n >= 0, "cannot read '", path, "': ", std::strerror(errno));
    if (n == 0) break;
    bytes.insert(bytes.end(), buf, buf + n);
  }
  return bytes;
}

}  // namespace lockstep
