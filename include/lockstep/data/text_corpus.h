#pragma once
// Reads a text corpus into entries (one entry is one sequence to tokenize).

#include <cstdint>
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

// Throws c10::Error naming the path when it cannot be read.
std::vector<std::string> read_text_corpus(const std::string& path, TextCorpusFormat format);

// Tokens to add to a tokenizer, one per line of `path` (--add-tokens, --add-special-tokens). A line
// ending in "\r\n" (a file written on Windows) gives its token without the '\r'; empty lines are
// skipped. Throws c10::ValueError naming the file and the line for a line of whitespace only (a
// token of blanks is never what such a line meant), and naming the file when it cannot be read.
std::vector<std::string> read_token_file(const std::string& path);

// A directory is fortunes; a file is fortunes when one of its lines is '%', lines otherwise.
TextCorpusFormat detect_text_corpus_format(const std::string& path);

// Entries with a category each: the name of the file they came from (a directory of fortune
// files has one category per file, "art", "computers", ...; a single file has one).
struct LabelledCorpus {
  std::vector<std::string> entries;
  std::vector<int64_t> labels;          // per entry, an index into categories
  std::vector<std::string> categories;  // file names, in the order read
};
// read_text_corpus in the detected format, file by file. Throws c10::Error naming the path when it
// holds no entry.
LabelledCorpus read_labelled_corpus(const std::string& path);

}  // namespace lockstep::data
