#pragma once

#include <signal.h>

#include <array>

#include "lockstep/launch/unique_fd.h"

namespace lockstep::launch {

// While alive, SIGINT, SIGTERM and SIGHUP to this process become bytes on a pipe that a
// supervision loop polls, so a supervisor (the launcher over its workers, `lockstep bench` over
// its child run) forwards them to its children instead of dying and leaving them running; SIGPIPE
// is ignored (a closed stdout loses output, not the job). Restores the previous actions. One may
// be alive at a time: between supervised runs the default action (die) is right.
class ShutdownSignals {
 public:
  ShutdownSignals();
  ~ShutdownSignals();
  ShutdownSignals(const ShutdownSignals&) = delete;
  ShutdownSignals& operator=(const ShutdownSignals&) = delete;

  int fd() const { return read_.get(); }
  // The first signal received and not yet taken, or 0.
  int take();

 private:
  static constexpr std::array<int, 3> kForwarded{SIGINT, SIGTERM, SIGHUP};
  UniqueFd read_;
  UniqueFd write_;
  std::array<struct sigaction, 3> saved_{};
  struct sigaction saved_pipe_ {};
};

}  // namespace lockstep::launch
