#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::log {

// One value of an event's summary that carries a scalar (simple_value); values of other kinds
// (images, histograms) are skipped.
struct ScalarValue {
  std::string tag;  // bytes as written; TensorBoard expects UTF-8
  float value = 0.0f;
};

// One Event record, with the fields SummaryWriter writes (tensorflow/core/util/event.proto).
struct Event {
  double wall_time = 0.0;    // seconds since the Unix epoch
  int64_t step = 0;
  std::string file_version;  // "brain.Event:2" on a file's first record, empty on the others
  std::vector<ScalarValue> scalars;
};

// Reads a TensorBoard event file (a sequence of TFRecords, as SummaryWriter and TensorFlow write
// it): checks both masked CRC-32Cs of every record and decodes each Event; fields it does not know
// are skipped as protobuf prescribes. Throws c10::Error naming the path, the record's index and
// byte offset, and what is wrong (truncated, CRC mismatch, malformed protobuf). A file still being
// written may end inside its last record: that is an error here too (read it again later).
std::vector<Event> read_tfevents(const std::string& path);

}  // namespace lockstep::log
