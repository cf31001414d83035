#pragma once

#include <string>

namespace lockstep {

// An exclusive lock on a directory for the life of this object: flock(2) on DIR/.lock, which
// holds the holder's pid and host. The kernel drops the lock when the process dies, however it
// dies, so a crashed or SIGKILLed run never leaves a stale lock behind (a restarted worker takes
// it again). Throws c10::Error naming the directory and the other holder when it is taken.
class DirectoryLock {
 public:
  DirectoryLock() = default;
  // `what` names the directory's role in errors, e.g. "--checkpoint-dir".
  DirectoryLock(const std::string& dir, const std::string& what);
  ~DirectoryLock();
  DirectoryLock(DirectoryLock&& other) noexcept;
  DirectoryLock& operator=(DirectoryLock&& other) noexcept;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace lockstep
