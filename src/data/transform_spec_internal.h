#pragma once
// What the transform spec's parser (transform_spec.cpp) and the table of transforms it knows
// (transform_registry.cpp) share. Private to src/data.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/data/transforms.h"

namespace lockstep::data::spec {

// A Python literal as a spec writes it. `text` is its source, for errors.
struct SpecValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kName, kTuple } kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string string;  // a quoted string's contents, or a dotted name
  std::vector<SpecValue> items;
  std::string text;
};

using SpecArgs = std::map<std::string, SpecValue>;

// One transform by torchvision's signature: its parameters in positional order, how many are
// required, and how to build it from the bound arguments (defaults are the constructor's).
struct SpecEntry {
  std::vector<std::string> params;
  size_t required;
  std::function<std::shared_ptr<const Transform>(const SpecArgs&)> make;
};

// No argument of a transform is larger than an image's side (65535 is JPEG's largest).
constexpr int64_t kMaxSpecInteger = 65535;

// The transforms a spec may name, by their short name ("Resize").
const std::map<std::string, SpecEntry>& registry();
// "CenterCrop, Grayscale, ...": every name registry() knows.
std::string known_transforms();
// "Resize(size, interpolation, max_size, antialias)".
std::string signature(const std::string& name, const SpecEntry& entry);

}  // namespace lockstep::data::spec
