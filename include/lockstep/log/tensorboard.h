#pragma once

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace lockstep::log {

// Buffering of SummaryWriter; defaults are torch.utils.tensorboard.SummaryWriter's.
// See Note [When SummaryWriter flushes].
struct SummaryWriterOptions {
  TORCH_ARG(int64_t, max_queue) = 10;   // records buffered before a flush to disk
  TORCH_ARG(double, flush_secs) = 120;  // seconds after which a pending record is flushed
};

// Writes scalars to a TensorBoard event file, LOG_DIR/events.out.tfevents.<unix_seconds>.<hostname>
// .<pid>.<n>, as torch.utils.tensorboard.SummaryWriter does (call it on rank 0 only). The file is a
// sequence of TFRecords, each an Event protobuf; the first carries file_version "brain.Event:2".
// `tensorboard --logdir LOG_DIR` reads it while it is being written.
// Every failure (creating LOG_DIR, a short write, disk full) throws c10::Error naming the path and
// the OS error.
class SummaryWriter {
 public:
  // Creates `log_dir` and any missing parents.
  explicit SummaryWriter(const std::string& log_dir, SummaryWriterOptions options = {});
  ~SummaryWriter();  // close(); an error there is only warned about (call close() to see it thrown)
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  // One point of the curve `tag` (e.g. "train/loss") at x = `global_step`. TensorBoard stores
  // scalars as float32, so `value` is rounded to float. `walltime` is in seconds since the Unix
  // epoch; default now.
  void add_scalar(const std::string& tag, double value, int64_t global_step,
                  std::optional<double> walltime = std::nullopt);

  // Hands buffered records to the OS.
  void flush();

  // Flushes and closes the file; later add_scalar/flush calls are errors. Idempotent.
  void close();

  const std::string& log_dir() const { return log_dir_; }
  const std::string& file_path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::string log_dir_;
  std::string path_;
  SummaryWriterOptions options_;
  std::FILE* file_ = nullptr;
  int64_t pending_ = 0;  // records written since the last flush
  std::chrono::steady_clock::time_point last_flush_;
};

namespace detail {
// CRC-32C (Castagnoli) of `bytes`, as TFRecord framing uses it before masking.
uint32_t crc32c(std::string_view bytes);
// TFRecord stores CRCs rotated and offset ("masked"): a CRC over data that embeds CRCs is
// otherwise weak.
uint32_t masked_crc32c(std::string_view bytes);
}  // namespace detail

}  // namespace lockstep::log
