#include "lockstep/log/progress.h"

#include <cmath>
#include <cstdio>

namespace lockstep::log {
namespace {

std::string minutes_seconds(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  char buf[32];
  const auto total = static_cast<long long>(s + 0.5);
  std::snprintf(buf, sizeof(buf), "%02lld:%02lld", total / 60, total % 60);
  return buf;
}

}  // namespace

Progress::Progress(std::ostream& out, bool terminal, std::string label, int64_t total_samples)
    : out_(out),
      terminal_(terminal),
      label_(std::move(label)),
      total_(std::max<int64_t>(1, total_samples)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

std::string Progress::render(int64_t done, double loss, double elapsed_s, bool with_bar) const {
  constexpr int kWidth = 20;
  const double fraction = std::min(1.0, static_cast<double>(done) / static_cast<double>(total_));
  const double rate = elapsed_s > 0 ? static_cast<double>(done) / elapsed_s : 0.0;
  const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : NAN;
  std::string bar;
  if (with_bar) {
    const int filled = static_cast<int>(fraction * kWidth);
    bar = " [" + std::string(filled, '#') + std::string(kWidth - filled, ' ') + "]";
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s%s %3d%% %lld/%lld %.0f samples/s ETA %s loss %.4f",
                label_.c_str(), bar.c_str(), static_cast<int>(fraction * 100),
                static_cast<long long>(done), static_cast<long long>(total_), rate,
                minutes_seconds(eta).c_str(), loss);
  return buf;
}

void Progress::update(int64_t done, double loss) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (terminal_) {
    if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    out_ << '\r' << render(done, loss, elapsed, /*with_bar=*/true) << "\x1b[K" << std::flush;
    drawn_ = true;
    return;
  }
  // Plain lines: one per tenth of the epoch reached (several tenths in one step give one line).
  const int64_t tenth = done * 10 / total_;
  if (tenth < next_tenth_) return;
  next_tenth_ = tenth + 1;
  out_ << render(done, loss, elapsed, /*with_bar=*/false) << '\n' << std::flush;
}

void Progress::finish() {
  if (terminal_ && drawn_) out_ << '\n' << std::flush;
  drawn_ = false;
}

}  // namespace lockstep::log
