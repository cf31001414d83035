#include "lockstep/data/text_corpus.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace lockstep::data {

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "cannot read the corpus '", path, "': ", std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void split_lines(const std::string& text, std::vector<std::string>& entries) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) entries.push_back(line);
}

void split_fortunes(const std::string& text, std::vector<std::string>& entries) {
  std::istringstream in(text);
  std::string entry;
  const auto finish = [&] {
    if (!entry.empty() && entry.back() == '\n') entry.pop_back();
    if (!entry.empty()) entries.push_back(entry);
    entry.clear();
  };
  for (std::string line; std::getline(in, line);) {
    if (line == "%") {
      finish();
    } else {
      entry += line;
      entry += '\n';
    }
  }
  finish();
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
  std::istringstream in(read_all(path));
  for (std::string line; std::getline(in, line);)
    if (line == "%") return TextCorpusFormat::kFortunes;
  return TextCorpusFormat::kLines;
}

LabelledCorpus read_labelled_corpus(const std::string& path) {
  const TextCorpusFormat format = detect_text_corpus_format(path);
  LabelledCorpus c;
  for (const auto& f : corpus_files(path, format)) {
    std::vector<std::string> entries = read_text_corpus(f, format);
    if (entries.empty()) continue;
    c.labels.insert(c.labels.end(), entries.size(), static_cast<int64_t>(c.categories.size()));
    c.categories.push_back(std::filesystem::path(f).filename().string());
    for (auto& e : entries) c.entries.push_back(std::move(e));
  }
  TORCH_CHECK_VALUE(!c.entries.empty(), "the corpus '", path, "' holds no entries: it is empty; give a text file ",
                    "with one entry per line (or entries separated by '%' lines)");
  return c;
}

std::vector<std::string> read_text_corpus(const std::string& path, TextCorpusFormat format) {
  const std::vector<std::string> files = corpus_files(path, format);
  std::vector<std::string> entries;
  for (const auto& f : files) {
    const std::string text = read_all(f);
    if (format == TextCorpusFormat::kLines) {
      split_lines(text, entries);
    } else {
      split_fortunes(text, entries);
    }
  }
  return entries;
}

}  // namespace lockstep::data
