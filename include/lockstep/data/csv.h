#pragma once
// Numeric tables in CSV files, for classifiers of tabular data.

#include <torch/types.h>

#include <string>
#include <vector>

namespace lockstep::data {

struct CsvTable {
  torch::Tensor features;  // float (N, F): every column but the label, in file order
  torch::Tensor labels;    // int64 (N), in [0, classes.size())
  std::vector<std::string> feature_names;
  // Class names by index. Labels that are all non-negative integers are their own index
  // (classes "0" .. the largest); otherwise the distinct labels sorted, as ImageFolder's classes.
  std::vector<std::string> classes;
};

// Bounds on what a CSV file may make the reader hold: one record's bytes (text data's entry limit),
// its fields, and the classes integer labels name (label k makes k + 1 classes).
inline constexpr size_t kMaxCsvRecordBytes = size_t{16} << 20;
inline constexpr size_t kMaxCsvColumns = 100000;
inline constexpr int64_t kMaxCsvClasses = 100000;

// A comma-separated file with a header line (RFC 4180: fields may be double-quoted, "" inside
// quotes is one quote; CRLF or LF line ends). Every column but `label_column` must hold a finite
// number in every row, within float32's range. Throws c10::ValueError naming the file, the line, the
// column and the value for a missing label column, a column named twice, a row with another number
// of fields, an empty, non-numeric or out-of-range cell, and anything beyond the bounds above.
CsvTable read_csv(const std::string& path, const std::string& label_column);

}  // namespace lockstep::data
