#include "lockstep/launch/shutdown_signals.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace lockstep::launch {
namespace {

// The write end of the self-pipe of the live ShutdownSignals; a signal handler can reach nothing
// but a global.
int g_signal_pipe = -1;

void on_shutdown_signal(int signal) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe, &byte, 1);
  errno = saved;
}

}  // namespace

ShutdownSignals::ShutdownSignals() {
  TORCH_CHECK(g_signal_pipe < 0, "only one ShutdownSignals may be alive at a time");
  int fds[2];
  TORCH_CHECK(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0, "pipe2: ", std::strerror(errno));
  read_ = UniqueFd(fds[0]);
  write_ = UniqueFd(fds[1]);
  g_signal_pipe = write_.get();
  struct sigaction action {};
  action.sa_handler = on_shutdown_signal;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < kForwarded.size(); ++i) ::sigaction(kForwarded[i], &action, &saved_[i]);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &saved_pipe_);
}

ShutdownSignals::~ShutdownSignals() {
  for (size_t i = 0; i < kForwarded.size(); ++i) ::sigaction(kForwarded[i], &saved_[i], nullptr);
  ::sigaction(SIGPIPE, &saved_pipe_, nullptr);
  g_signal_pipe = -1;
}

int ShutdownSignals::take() {
  unsigned char byte = 0;
  return ::read(read_.get(), &byte, 1) == 1 ? byte : 0;
}

}  // namespace lockstep::launch
