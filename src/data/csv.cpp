#include "lockstep/data/csv.h"

#include <torch/torch.h>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

namespace lockstep::data {
namespace {

// Splits one record starting at `pos` of `text` into fields; advances `pos` past its line end
// (a quoted field may hold line ends). `line` counts the lines consumed. A record longer than
// kMaxCsvRecordBytes, or of more than kMaxCsvColumns fields, is refused before it is kept.
std::vector<std::string> next_record(const std::string& text, size_t& pos, int64_t& line, const std::string& path) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  const int64_t first_line = line;
  const size_t start = pos;
  for (; pos < text.size(); ++pos) {
    TORCH_CHECK_VALUE(pos - start < kMaxCsvRecordBytes, "CSV file '", path, "' line ", first_line,
                      ": a record longer than ", kMaxCsvRecordBytes, " bytes (the limit); is this a CSV file?");
    const char c = text[pos];
    if (quoted) {
      if (c == '"' && pos + 1 < text.size() && text[pos + 1] == '"') {
        fields.back() += '"';
        ++pos;
      } else if (c == '"') {
        quoted = false;
      } else {
        if (c == '\n') ++line;
        fields.back() += c;
      }
    } else if (c == '"' && fields.back().empty()) {
      quoted = true;
    } else if (c == ',') {
      TORCH_CHECK_VALUE(fields.size() < kMaxCsvColumns, "CSV file '", path, "' line ", first_line, ": more than ",
                        kMaxCsvColumns, " fields (the limit)");
      fields.emplace_back();
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && pos + 1 < text.size() && text[pos + 1] == '\n') ++pos;
      ++pos;
      ++line;
      return fields;
    } else {
      fields.back() += c;
    }
  }
  TORCH_CHECK_VALUE(!quoted, "CSV file '", path, "' line ", first_line, ": a quoted field has no closing quote");
  ++line;
  return fields;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

CsvTable read_csv(const std::string& path, const std::string& label_column) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  TORCH_CHECK_VALUE(!std::filesystem::exists(status) || std::filesystem::is_regular_file(status), "CSV file '", path,
                    "' is not a regular file (a directory, device, pipe or socket); give the path of a file");
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK_VALUE(in, "cannot read CSV file '", path, "': ", std::strerror(errno));
  std::string text(std::filesystem::file_size(path, ec), '\0');  // one copy of the file, not three
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  TORCH_CHECK_VALUE(!ec && in.gcount() == static_cast<std::streamsize>(text.size()), "cannot read CSV file '", path,
                    "': ", ec ? ec.message() : "it changed while it was read");
  size_t pos = text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;  // a UTF-8 byte order mark
  int64_t line = 1;
  TORCH_CHECK_VALUE(pos < text.size(), "CSV file '", path, "' is empty; it needs a header line naming the columns");
  std::vector<std::string> header = next_record(text, pos, line, path);
  for (std::string& h : header) h = trim(h);
  std::map<std::string, size_t> seen;  // a second column of a name would be read as a feature: the label's leaks
  for (size_t c = 0; c < header.size(); ++c) {
    const auto [at, fresh] = seen.emplace(header[c], c);
    TORCH_CHECK_VALUE(fresh, "CSV file '", path, "' names column '", header[c], "' twice (columns ", at->second + 1,
                      " and ", c + 1, "); give every column its own name");
  }
  const auto label_at = std::find(header.begin(), header.end(), label_column);
  TORCH_CHECK_VALUE(label_at != header.end(), "CSV file '", path, "' has no column '", label_column,
                    "' for the labels; its header names: ", c10::Join(", ", header));
  const auto label = static_cast<size_t>(label_at - header.begin());
  TORCH_CHECK_VALUE(header.size() >= 2, "CSV file '", path, "' has only the label column; it needs features too");

  CsvTable t;
  for (size_t c = 0; c < header.size(); ++c)
    if (c != label) t.feature_names.push_back(header[c]);
  std::vector<float> features;
  std::vector<std::string> labels;
  while (pos < text.size()) {
    const int64_t at = line;
    std::vector<std::string> fields = next_record(text, pos, line, path);
    if (fields.size() == 1 && trim(fields[0]).empty()) continue;  // a blank line
    TORCH_CHECK_VALUE(fields.size() == header.size(), "CSV file '", path, "' line ", at, " has ", fields.size(),
                      " fields but the header has ", header.size());
    for (size_t c = 0; c < fields.size(); ++c) {
      const std::string cell = trim(fields[c]);
      if (c == label) {
        TORCH_CHECK_VALUE(!cell.empty(), "CSV file '", path, "' line ", at, ": the label ('", label_column,
                          "') is empty");
        labels.push_back(cell);
        continue;
      }
      char* end = nullptr;
      errno = 0;
      const double v = cell.empty() ? NAN : std::strtod(cell.c_str(), &end);
      TORCH_CHECK_VALUE(!cell.empty() && end == cell.c_str() + cell.size() && std::isfinite(v) && errno != ERANGE,
                        "CSV file '", path, "' line ", at, " column '", header[c], "': '", cell,
                        "' is not a finite number; every column but the label must be numeric (fill or drop "
                        "missing values before training)");
      TORCH_CHECK_VALUE(std::abs(v) <= std::numeric_limits<float>::max(), "CSV file '", path, "' line ", at,
                        " column '", header[c], "': ", cell, " is outside float32's range (magnitude at most ",
                        std::numeric_limits<float>::max(), "); features are float32, so scale the column");
      features.push_back(static_cast<float>(v));
    }
  }
  const auto n = static_cast<int64_t>(labels.size());
  TORCH_CHECK_VALUE(n > 0, "CSV file '", path, "' has a header but no rows");
  t.features = torch::from_blob(features.data(), {n, static_cast<int64_t>(t.feature_names.size())}, torch::kFloat).clone();

  const bool integers = std::all_of(labels.begin(), labels.end(), [](const std::string& l) {
    return l.size() <= 9 && std::all_of(l.begin(), l.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  });
  std::vector<int64_t> ids(labels.size());
  if (integers) {
    int64_t largest = 0;
    for (size_t i = 0; i < labels.size(); ++i) {
      ids[i] = std::stoll(labels[i]);
      TORCH_CHECK_VALUE(ids[i] < kMaxCsvClasses, "CSV file '", path, "': label ", ids[i], " (row ", i + 1,
                        ") would make ", ids[i] + 1, " classes; integer labels are their own class index, at most ",
                        kMaxCsvClasses - 1, ". Number the classes from 0, or write them as names");
      largest = std::max(largest, ids[i]);
    }
    for (int64_t k = 0; k <= largest; ++k) t.classes.push_back(std::to_string(k));
  } else {
    std::map<std::string, int64_t> index;
    for (const std::string& l : labels) index.emplace(l, 0);
    for (auto& [name, id] : index) {
      id = static_cast<int64_t>(t.classes.size());
      t.classes.push_back(name);
    }
    for (size_t i = 0; i < labels.size(); ++i) ids[i] = index.at(labels[i]);
  }
  t.labels = torch::tensor(ids, torch::kInt64);
  return t;
}

}  // namespace lockstep::data
