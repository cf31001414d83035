#pragma once
// Python's spelling of the values in transform specs, for Transform::str(): shortest round-trip
// floats with a ".0" when integral, tuples with a trailing comma when of one element.

#include <charconv>
#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::data {

inline std::string format_float(double x) {
  char buf[32];
  const auto result = std::to_chars(buf, buf + sizeof(buf), x);
  std::string s(buf, result.ptr);
  if (s.find_first_of(".eni") == std::string::npos) s += ".0";  // 1 -> 1.0; not 1e-05, inf, nan
  return s;
}

template <typename T, typename Format>
std::string format_tuple(const std::vector<T>& values, Format format) {
  std::string s = "(";
  for (size_t i = 0; i < values.size(); ++i) s += (i > 0 ? ", " : "") + format(values[i]);
  return s + (values.size() == 1 ? ",)" : ")");
}

inline std::string format_floats(const std::vector<double>& values) { return format_tuple(values, format_float); }

inline std::string format_ints(const std::vector<int64_t>& values) {
  return format_tuple(values, [](int64_t v) { return std::to_string(v); });
}

// A size as torchvision takes it: one value as an int, more as a tuple.
inline std::string format_size(const std::vector<int64_t>& values) {
  return values.size() == 1 ? std::to_string(values[0]) : format_ints(values);
}

// A crop's (height, width): an int when square, as torchvision's _setup_size takes it.
inline std::string format_hw(int64_t height, int64_t width) {
  return height == width ? std::to_string(height) : format_ints({height, width});
}

}  // namespace lockstep::data
