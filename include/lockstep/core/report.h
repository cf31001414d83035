#pragma once

#include <exception>
#include <functional>
#include <string>

namespace lockstep {

// Note [Reports]
// Library code does not write to stdout or stderr. What a run has to say beside its results goes
// to a Reporter that its caller chooses: what it is doing (resumed from a checkpoint, an epoch
// done, stages cut by time), warnings it recovers from (a checkpoint skipped, a cut-off log line)
// and errors it outlives (a checkpoint not saved while training goes on). stdio_reporter() prints
// them as the `lockstep` command always has; a program that logs elsewhere passes its own
// function, and an empty Reporter drops them.
enum class ReportKind {
  kInfo,     // stdout, as it is
  kNotice,   // stderr, after "lockstep: " (the program's name)
  kWarning,  // stderr, after "lockstep: warning: "
  kError,    // stderr, after "lockstep: error: "
};

// One line of text (no trailing newline) of a kind. Called from the thread that runs the
// component; components that run on several ranks report on each unless they say otherwise.
using Reporter = std::function<void(ReportKind kind, const std::string& line)>;

// Each line to stdout or stderr as ReportKind says, flushed; `program` names the prefix
// ("lockstep: warning: ...").
Reporter stdio_reporter(const std::string& program = "lockstep");

// What `e` says, without the C++ backtrace a c10::Error carries: for a message that wraps it.
std::string error_text(const std::exception& e);

// Sends `line` to `reporter` unless it is empty.
inline void report(const Reporter& reporter, ReportKind kind, const std::string& line) {
  if (reporter) reporter(kind, line);
}

}  // namespace lockstep
