#pragma once
// Reads a text corpus into entries (one entry is one sequence to tokenize).

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

}  // namespace lockstep::data
