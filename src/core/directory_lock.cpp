#include "lockstep/core/directory_lock.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

namespace lockstep {
namespace {

std::string host_name() {
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? name : "unknown host";
}

// What the holder wrote into the lock file: "pid <N> on <host>", or "" when unreadable.
std::string holder_of(int fd) {
  char text[512] = {};
  const ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
  std::string holder = n > 0 ? std::string(text, static_cast<size_t>(n)) : "";
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
  return holder;
}

}  // namespace

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& what) : dir_(dir), what_(what) { take(); }

void DirectoryLock::take() {
  const std::string& dir = dir_;
  const std::string& what = what_;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = (std::filesystem::path(dir) / ".lock").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  TORCH_CHECK(fd >= 0, "cannot lock ", what, " '", dir, "': opening '", path, "' failed: ", std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    const std::string holder = holder_of(fd);
    ::close(fd);
    TORCH_CHECK(error == EWOULDBLOCK, "cannot lock ", what, " '", dir, "': ", std::strerror(error));
    TORCH_CHECK(false, what, " '", dir, "' is in use by another run (",
                holder.empty() ? "its pid is not recorded" : holder,
                "): two runs writing one directory overwrite and prune each other's checkpoints. Give this run ",
                "its own ", what, ", or wait for the other run to end");
  }
  const std::string holder = "pid " + std::to_string(::getpid()) + " on " + host_name() + "\n";
  // Best effort: without the note the lock still holds; only another run's error lacks the pid.
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, holder.data(), holder.size(), 0);
  struct stat st {};
  ::fstat(fd, &st);
  device_ = st.st_dev;
  inode_ = st.st_ino;
  fd_ = fd;
}

// See Note [A lock that survives its directory].
bool DirectoryLock::intact() const {
  struct stat st {};
  return fd_ >= 0 && ::stat((std::filesystem::path(dir_) / ".lock").c_str(), &st) == 0 && st.st_dev == device_ &&
         st.st_ino == inode_;
}

void DirectoryLock::retake() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  take();
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

DirectoryLock::DirectoryLock(DirectoryLock&& other) noexcept
    : dir_(std::move(other.dir_)),
      what_(std::move(other.what_)),
      fd_(std::exchange(other.fd_, -1)),
      device_(other.device_),
      inode_(other.inode_) {}

DirectoryLock& DirectoryLock::operator=(DirectoryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    dir_ = std::move(other.dir_);
    what_ = std::move(other.what_);
    fd_ = std::exchange(other.fd_, -1);
    device_ = other.device_;
    inode_ = other.inode_;
  }
  return *this;
}

}  // namespace lockstep
