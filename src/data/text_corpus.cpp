#include "lockstep/data/text_corpus.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "lockstep/core/line_reader.h"

namespace lockstep::data {

namespace {

std::string too_long(const LineReader& in, size_t max_entry_bytes) {
  return c10::str("the corpus '", in.path(), "' line ", in.line_number(), " starts an entry longer than ", max_entry_bytes,
                  " bytes, the most one entry may hold: entries are lines (or '%'-separated fortunes); is it a text ",
                  "file? Split what belongs to several entries onto lines of their own");
}

// Entries of one file, each passed to `take` until it returns false; false then.
bool read_entries(const std::string& path, TextCorpusFormat format, size_t max_entry_bytes,
                  const std::function<bool(std::string&)>& take) {
  LineReader in(path, max_entry_bytes, "the corpus");
  std::string line, entry;
  if (format == TextCorpusFormat::kLines) {
    while (in.next(line)) {
      TORCH_CHECK_VALUE(!in.too_long(), too_long(in, max_entry_bytes));
      if (!take(line)) return false;
    }
    return true;
  }
  const auto finish = [&] {
    if (!entry.empty() && entry.back() == '\n') entry.pop_back();
    const bool more = entry.empty() || take(entry);
    entry.clear();
    return more;
  };
  int64_t first_line = 1;  // of the entry being read
  while (in.next(line)) {
    if (line == "%") {
      if (!finish()) return false;
      first_line = in.line_number() + 1;
      continue;
    }
    if (in.too_long() || entry.size() + line.size() + 1 > max_entry_bytes)
      TORCH_CHECK_VALUE(false, "the corpus '", path, "' has an entry (lines ", first_line, " to ", in.line_number(),
                        " and on) longer than ", max_entry_bytes, " bytes, the most one entry may hold: is every ",
                        "fortune ended by a '%' line?");
    entry += line;
    entry += '\n';
  }
  return finish();
}

// The files a corpus path names: itself, or a directory's fortune files in name order.
std::vector<std::string> corpus_files(const std::string& path, TextCorpusFormat format) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return {path};
  TORCH_CHECK(format == TextCorpusFormat::kFortunes, "the corpus '", path,
              "' is a directory: only the fortunes format reads directories; give a file");
  for (const auto& e : fs::directory_iterator(path))
    if (e.is_regular_file() && !e.is_symlink() && !e.path().has_extension()) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  TORCH_CHECK(!files.empty(), "the corpus directory '", path, "' holds no fortune files (names without an extension)");
  return files;
}

}  // namespace

const std::vector<std::string>& text_corpus_format_names() {
  static const std::vector<std::string> names{"lines", "fortunes"};
  return names;
}

std::vector<std::string> read_token_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK_VALUE(in, "cannot read the token file '", path, "': ", std::strerror(errno),
                    "; give a file with one token per line");
  std::vector<std::string> tokens;
  int64_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    TORCH_CHECK_VALUE(line.find_first_not_of(" \t\v\f") != std::string::npos, "the token file '", path, "' line ",
                      number, " holds only whitespace; a token of blanks is not what such a line means: delete it");
    tokens.push_back(std::move(line));
  }
  return tokens;
}

TextCorpusFormat detect_text_corpus_format(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return TextCorpusFormat::kFortunes;
  // The first lines decide, so that a stream is not read to its end (and a '%' line comes with
  // the first fortune).
  LineReader in(path, kFormatDetectionBytes, "the corpus");
  size_t seen = 0;
  for (std::string line; seen < kFormatDetectionBytes && in.next(line);) {
    if (line == "%") return TextCorpusFormat::kFortunes;
    seen += line.size() + 1;
  }
  return TextCorpusFormat::kLines;
}

LabelledCorpus read_labelled_corpus(const std::string& path, const std::function<bool(const LabelledCorpus&)>& enough,
                                    size_t max_entry_bytes) {
  const TextCorpusFormat format = detect_text_corpus_format(path);
  const std::vector<std::string> files = corpus_files(path, format);
  LabelledCorpus c;
  size_t f = 0;
  for (bool more = true; more && f < files.size(); ++f) {
    const std::string name = std::filesystem::path(files[f]).filename().string();
    more = read_entries(files[f], format, max_entry_bytes, [&](std::string& entry) {
      if (c.categories.empty() || c.categories.back() != name) c.categories.push_back(name);
      c.entries.push_back(std::move(entry));
      c.labels.push_back(static_cast<int64_t>(c.categories.size()) - 1);
      return !enough || !enough(c);
    });
  }
  // Files not read are categories too: reading stopped before them, not because they are empty.
  for (; f < files.size(); ++f) c.categories.push_back(std::filesystem::path(files[f]).filename().string());
  TORCH_CHECK_VALUE(!c.entries.empty(), "the corpus '", path, "' holds no entries: it is empty; give a text file ",
                    "with one entry per line (or entries separated by '%' lines)");
  return c;
}

std::vector<std::string> read_text_corpus(const std::string& path, TextCorpusFormat format, size_t max_entry_bytes) {
  std::vector<std::string> entries;
  for (const auto& f : corpus_files(path, format))
    read_entries(f, format, max_entry_bytes, [&](std::string& entry) {
      entries.push_back(std::move(entry));
      return true;
    });
  return entries;
}

}  // namespace lockstep::data
