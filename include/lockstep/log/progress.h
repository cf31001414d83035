#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

namespace lockstep::log {

// A tqdm-like progress display for one epoch. On a terminal it redraws one line in place (at most
// ten times a second): "epoch 1/3 [#####     ]  52% 31200/60000 4120 samples/s ETA 00:07 loss 0.4121".
// Elsewhere (a pipe, a log file) it prints a plain line at each tenth of the epoch.
class Progress {
 public:
  Progress(std::ostream& out, bool terminal, std::string label, int64_t total_samples);

  // `done` samples of `total_samples` are finished; `loss` is the latest step's loss.
  void update(int64_t done, double loss);

  // Ends the line (terminal) so later output starts on a fresh one.
  void finish();

 private:
  std::string render(int64_t done, double loss, double elapsed_s, bool with_bar) const;

  std::ostream& out_;
  bool terminal_;
  std::string label_;
  int64_t total_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  int64_t next_tenth_ = 1;  // plain mode: the next tenth of the epoch that gets a line
  bool drawn_ = false;
};

}  // namespace lockstep::log
