#pragma once
// The fast path of infer request parsing: the numbers of inputs[i].data read straight from the
// body's text. Private to src/serve (http_protocol.cpp).

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::serve::json_scan {

// How the numbers of an input's "data" were nested: each array's depth (1: the outermost) and
// length, and the depth of the numbers. Checked against the shape by http_protocol.cpp.
struct Layout {
  std::vector<std::pair<size_t, size_t>> arrays;  // (depth, elements)
  size_t number_depth = 0;  // 0: no number seen
  bool uneven = false;      // numbers at different depths

  void number(size_t depth) {
    uneven = uneven || (number_depth != 0 && number_depth != depth);
    number_depth = depth;
  }
};

// Note [Reading tensor data without a JSON DOM]
// A batch-1 request for a 28x28 image is some 10 kB of JSON, almost all of it the 784 numbers of
// inputs[i].data. Parsed into a DOM, each number costs a lexer pass with a token copy, strtod and
// a json node; at concurrency 32 that was a third of the server's CPU (perf, 2026-11-23). So the
// body is scanned once for the structure alone (strings, brackets, the keys on the path
// inputs[i].data); a data array made only of JSON numbers, flat or nested, is read there with
// std::from_chars (into the integer or double nlohmann would hold, then a float, as
// json::get<float> does) and replaced by null in a
// copy of the JSON that the DOM parser then reads. Anything else in that place (a string, a
// number JSON does not allow, one out of double's range) is left in the text, so the DOM parser and
// flatten() report it as before (a parse error is reported from the body as sent): the fast path
// changes speed, never a result or a message. (The scan also counts the inputs, so that a body
// with more of them than the model takes is refused before a DOM is built: parse_infer_request.) Integer inputs, which a float cannot hold exactly,
// are read again from their span of the body.
struct ScannedBody {
  std::string json;                         // the body with each extracted data array as null
  std::vector<std::vector<float>> inputs;   // inputs[i].data for the i-th extracted input
  std::vector<Layout> layouts;              // how each was nested
  std::vector<size_t> input_index;          // which input each extracted array belongs to
  std::vector<std::pair<size_t, size_t>> spans;  // where each is in the body: [begin, end) bytes
  // The elements of the top-level "inputs" array as its commas count them (1 for an array without
  // a comma, empty or not; of the last such array, the one a DOM keeps): known before any DOM.
  size_t input_entries = 0;
  // Every string closed, every bracket closed by its kind and nothing left open: a body cut short
  // or mis-nested is not, and goes to the DOM parser to be reported as malformed.
  bool balanced = true;
};

// See Note [Reading tensor data without a JSON DOM]. Malformed JSON is copied as it is, for the
// DOM parser to report. Past `max_inputs` entries of "inputs" (a request the caller refuses) the
// scan only counts them, and a balanced body is not copied into `json`.
ScannedBody scan_body(const char* text, size_t n, size_t max_inputs);

}  // namespace lockstep::serve::json_scan
