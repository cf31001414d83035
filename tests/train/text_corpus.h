#pragma once
// A small seeded text corpus for the text training tests: sentences of a little grammar, so a
// language model can beat the unigram baseline within seconds; every line has at least 12 words.
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "lockstep/core/atomic_file.h"

namespace lockstep::testing {

inline void write_grammar_corpus(const std::string& path, int lines, unsigned seed = 7) {
  const std::vector<std::string> adj{"quick", "lazy", "small", "happy", "old"};
  const std::vector<std::string> noun{"fox", "dog", "cat", "bird", "horse", "mouse"};
  const std::vector<std::string> verb{"sees", "chases", "likes", "finds"};
  std::mt19937 rng(seed);
  auto pick = [&](const std::vector<std::string>& w) { return w[rng() % w.size()]; };
  std::ofstream out(path);
  for (int i = 0; i < lines; ++i) {
    for (int s = 0; s < 2; ++s)
      out << (s ? " " : "") << "the " << pick(adj) << " " << pick(noun) << " " << pick(verb) << " the " << pick(noun) << ".";
    out << "\n";
  }
}

// Final parameters (by state-dict key) of a run that saved its model to `path`.
inline std::vector<std::pair<std::string, torch::Tensor>> saved_state(const std::string& path) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& e : torch::pickle_load(read_file(path)).toGenericDict())
    out.emplace_back(e.key().toStringRef(), e.value().toTensor());
  return out;
}

}  // namespace lockstep::testing
