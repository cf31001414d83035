#pragma once
// Running a test's body in a forked child, for what changes the whole process (glibc's heap, the
// CPU allocator), so that the test binary keeps its own.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>

namespace lockstep::testing {

// Runs `f` in a forked child and returns its result; -100 and below when the child failed.
inline int64_t in_child(const std::function<int64_t()>& f) {
  int fds[2];
  if (::pipe(fds) != 0) return -100;
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    int64_t result = -101;
    try {
      result = f();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    const ssize_t written = ::write(fds[1], &result, sizeof(result));
    ::_exit(written == sizeof(result) ? 0 : 1);
  }
  ::close(fds[1]);
  int64_t result = -102;
  if (::read(fds[0], &result, sizeof(result)) != sizeof(result)) result = -102;
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  return result;
}

}  // namespace lockstep::testing
