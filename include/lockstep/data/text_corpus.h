#pragma once
// Reads a text corpus into entries (one entry is one sequence to tokenize).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lockstep::data {

enum class TextCorpusFormat {
  kLines,     // one entry per line (an empty line is an empty entry, so line numbers are kept)
  // The fortune(6) format: entries separated by lines holding only '%'. An entry keeps its inner
  // newlines ('\n'), without the last one; empty entries are skipped. A directory means every
  // fortune file in it (names without an extension; fortune's .dat indexes and .u8 links are not),
  // in name order, as /usr/share/games/fortunes is laid out.
  kFortunes,
};
const std::vector<std::string>& text_corpus_format_names();  // lines, fortunes

// The most bytes one entry may hold (16 MiB). Reading holds at most this much of an entry, so a
// file without newlines (/dev/zero, a binary file) is refused after reading this much, quickly
// and in bounded memory, and naming the file, the line and the limit.
constexpr size_t kMaxTextEntryBytes = size_t{1} << 24;
// How much of a file detect_text_corpus_format looks at for a '%' line.
constexpr size_t kFormatDetectionBytes = size_t{1} << 20;

// Throws c10::Error naming the path when it cannot be read, c10::ValueError naming it, the line
// and the limit for an entry longer than `max_entry_bytes`.
std::vector<std::string> read_text_corpus(const std::string& path, TextCorpusFormat format,
                                          size_t max_entry_bytes = kMaxTextEntryBytes);

// Tokens to add to a tokenizer, one per line of `path` (--add-tokens, --add-special-tokens). A line
// ending in "\r\n" (a file written on Windows) gives its token without the '\r'; empty lines are
// skipped. Throws c10::ValueError naming the file and the line for a line of whitespace only (a
// token of blanks is never what such a line meant), and naming the file when it cannot be read.
std::vector<std::string> read_token_file(const std::string& path);

// A directory is fortunes; a file is fortunes when one of its lines in its first
// kFormatDetectionBytes is '%', lines otherwise.
TextCorpusFormat detect_text_corpus_format(const std::string& path);

// Entries with a category each: the name of the file they came from (a directory of fortune
// files has one category per file, "art", "computers", ...; a single file has one).
struct LabelledCorpus {
  std::vector<std::string> entries;
  std::vector<int64_t> labels;          // per entry, an index into categories
  std::vector<std::string> categories;  // file names, in the order read
};
// read_text_corpus in the detected format, file by file, until `enough` (called after each entry)
// says so: then the rest is not read, and the files not read are still categories. Throws
// c10::Error naming the path when it holds no entry.
LabelledCorpus read_labelled_corpus(const std::string& path, const std::function<bool(const LabelledCorpus&)>& enough = {},
                                    size_t max_entry_bytes = kMaxTextEntryBytes);

}  // namespace lockstep::data
