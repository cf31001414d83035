#pragma once

#include <sys/types.h>

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

  // Note [A lock that survives its directory]
  // The lock is on DIR/.lock, the file this object opened. When the directory is removed mid-run
  // (`rm -rf`) or replaced, the lock guards a file nobody can reach: a second run on a new DIR
  // makes a new .lock and is let in, and both write. So a holder asks before each write whether
  // DIR/.lock is still its file (same device and inode), and when it is not, takes the lock
  // again on a new DIR/.lock: atomically, since flock lets one of two racing runs have it. If
  // another run got there first, it stops writing there.

  // Whether DIR/.lock is still the file this lock holds.
  bool intact() const;
  // Makes DIR again if needed and locks a new DIR/.lock; throws as the constructor does when
  // another run holds it now, and then holds nothing.
  void retake();

 private:
  void take();

  std::string dir_;
  std::string what_;
  int fd_ = -1;
  dev_t device_ = 0;
  ino_t inode_ = 0;
};

}  // namespace lockstep
