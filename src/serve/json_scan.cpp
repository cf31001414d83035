#include "json_scan.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <system_error>

namespace lockstep::serve::json_scan {
namespace {

bool json_digit(char c) { return c >= '0' && c <= '9'; }

// Reads a JSON number at text[i..n): the grammar of RFC 8259 (no '+', no leading zeros, no bare
// '.'), then its value as a float the way nlohmann::json does: an integer that fits 64 bits as
// an integer (so "-0" is 0), anything else as a double. Returns false for anything else, or a
// value outside double's range.
bool read_number(const char* text, size_t n, size_t& i, float& value) {
  const size_t start = i;
  if (i < n && text[i] == '-') ++i;
  if (i < n && text[i] == '0') {
    ++i;
  } else {
    if (i >= n || !json_digit(text[i])) return false;
    while (i < n && json_digit(text[i])) ++i;
  }
  bool integer = true;
  if (i < n && text[i] == '.') {
    integer = false;
    if (++i >= n || !json_digit(text[i])) return false;
    while (i < n && json_digit(text[i])) ++i;
  }
  if (i < n && (text[i] == 'e' || text[i] == 'E')) {
    integer = false;
    if (++i < n && (text[i] == '+' || text[i] == '-')) ++i;
    if (i >= n || !json_digit(text[i])) return false;
    while (i < n && json_digit(text[i])) ++i;
  }
  const char *first = text + start, *last = text + i;
  if (integer) {
    int64_t signed_value = 0;
    const auto as_signed = std::from_chars(first, last, signed_value);
    if (as_signed.ec == std::errc() && as_signed.ptr == last) return value = static_cast<float>(signed_value), true;
    uint64_t unsigned_value = 0;
    const auto as_unsigned = std::from_chars(first, last, unsigned_value);
    if (as_unsigned.ec == std::errc() && as_unsigned.ptr == last) return value = static_cast<float>(unsigned_value), true;
  }
  double number = 0.0;
  const auto [end, ec] = std::from_chars(first, last, number);
  value = static_cast<float>(number);
  return ec == std::errc() && end == last;
}

size_t skip_space(const char* text, size_t n, size_t i) {
  while (i < n && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t')) ++i;
  return i;
}

// Reads the array of numbers (nested to any depth) that starts at text[i] == '['; on success
// appends them to `out`, their nesting to `layout`, and returns the index after its ']'. Returns 0
// when it is anything else.
size_t read_number_array(const char* text, size_t n, size_t i, std::vector<float>& out, Layout& layout) {
  std::vector<size_t> lengths;  // of the arrays open, outermost first
  do {
    i = skip_space(text, n, i);
    if (!lengths.empty()) ++lengths.back();  // a value of the innermost open array
    if (i < n && text[i] == '[') {  // an array opens: a value or ']' follows
      lengths.push_back(0);
      i = skip_space(text, n, i + 1);
      if (i < n && text[i] == ']') {
        layout.arrays.emplace_back(lengths.size(), 0);
        lengths.pop_back();
        ++i;
      } else {
        continue;
      }
    } else {
      float value = 0.0f;
      if (!read_number(text, n, i, value)) return 0;
      out.push_back(value);
      layout.number(lengths.size());
    }
    // After a value: ',' and another value, or ']' closing one or more arrays.
    for (i = skip_space(text, n, i); !lengths.empty() && i < n && text[i] == ']'; i = skip_space(text, n, i + 1)) {
      layout.arrays.emplace_back(lengths.size(), lengths.back());
      lengths.pop_back();
    }
    if (lengths.empty()) return i;
    if (i >= n || text[i] != ',') return 0;
    ++i;
  } while (true);
}

}  // namespace

ScannedBody scan_body(const char* text, size_t n, size_t max_inputs) {
  struct Frame {
    bool object;
    std::string key;  // an object's current key (raw bytes between the quotes)
    size_t index = 0; // an array's current element
  };
  ScannedBody scanned;
  std::vector<Frame> stack;
  size_t copied = 0;  // text[0, copied) is in scanned.json
  bool at_key = false;
  for (size_t i = 0; i < n;) {
    const char c = text[i];
    if (c == '"') {
      const size_t start = ++i;
      while (i < n && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
      scanned.balanced = scanned.balanced && i < n;
      if (at_key && !stack.empty()) stack.back().key.assign(text + start, std::min(i, n) - start), at_key = false;
      ++i;
    } else if (c == '{' || c == '[') {
      const bool input_data = c == '[' && stack.size() == 3 && stack[0].object && stack[0].key == "inputs" &&
                              !stack[1].object && stack[2].object && stack[2].key == "data" &&
                              scanned.input_entries <= max_inputs;
      std::vector<float> values;
      Layout layout;
      const size_t end = input_data ? read_number_array(text, n, i, values, layout) : 0;
      if (end != 0) {
        scanned.json.append(text + copied, i - copied).append("null");
        scanned.inputs.push_back(std::move(values));
        scanned.layouts.push_back(std::move(layout));
        scanned.input_index.push_back(stack[1].index);
        scanned.spans.emplace_back(i, end);
        copied = i = end;
        continue;
      }
      if (c == '[' && stack.size() == 1 && stack[0].object && stack[0].key == "inputs") scanned.input_entries = 1;
      stack.push_back({c == '{', "", 0});
      at_key = c == '{';
      ++i;
    } else if (c == '}' || c == ']') {
      scanned.balanced = scanned.balanced && !stack.empty() && stack.back().object == (c == '}');
      if (!stack.empty()) stack.pop_back();
      at_key = false;
      ++i;
    } else if (c == ',') {
      if (!stack.empty() && stack.back().object) at_key = true;
      if (!stack.empty() && !stack.back().object) ++stack.back().index;
      if (stack.size() == 2 && !stack[1].object && stack[0].object && stack[0].key == "inputs")
        scanned.input_entries = stack[1].index + 1;
      ++i;
    } else {
      ++i;
    }
  }
  scanned.balanced = scanned.balanced && stack.empty();
  if (scanned.input_entries <= max_inputs || !scanned.balanced) scanned.json.append(text + copied, n - copied);
  return scanned;
}

}  // namespace lockstep::serve::json_scan
