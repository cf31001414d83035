// The transforms a spec may name (transform_spec_internal.h): each by torchvision's signature,
// its arguments converted and checked, and built.
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "lockstep/data/image.h"
#include "transform_spec_internal.h"

namespace lockstep::data::spec {
namespace {

[[noreturn]] void bad_value(const SpecValue& v, const std::string& expected) {
  TORCH_CHECK_VALUE(false, "expected ", expected, ", got '", v.text, "'");
}

int64_t to_int(const SpecValue& v) {
  if (v.kind != SpecValue::Kind::kInt) bad_value(v, "an int");
  return v.integer;
}

double to_float(const SpecValue& v) {
  if (v.kind == SpecValue::Kind::kInt) return static_cast<double>(v.integer);
  if (v.kind != SpecValue::Kind::kFloat) bad_value(v, "a number");
  return v.real;
}

bool to_bool(const SpecValue& v) {
  if (v.kind != SpecValue::Kind::kBool) bad_value(v, "True or False");
  return v.boolean;
}

// An int, or a tuple or list of ints of one of `lengths`.
std::vector<int64_t> to_ints(const SpecValue& v, std::vector<size_t> lengths, const std::string& expected) {
  if (v.kind == SpecValue::Kind::kInt) return {v.integer};
  if (v.kind != SpecValue::Kind::kTuple || std::find(lengths.begin(), lengths.end(), v.items.size()) == lengths.end())
    bad_value(v, expected);
  std::vector<int64_t> out;
  for (const auto& item : v.items) out.push_back(to_int(item));
  return out;
}

std::vector<double> to_floats(const SpecValue& v, const std::string& expected) {
  if (v.kind == SpecValue::Kind::kInt || v.kind == SpecValue::Kind::kFloat) return {to_float(v)};
  if (v.kind != SpecValue::Kind::kTuple || v.items.empty()) bad_value(v, expected);
  std::vector<double> out;
  for (const auto& item : v.items) out.push_back(to_float(item));
  return out;
}

std::pair<double, double> to_range(const SpecValue& v) {
  const auto values = to_floats(v, "a (min, max) pair");
  if (values.size() != 2) bad_value(v, "a (min, max) pair");
  return {values[0], values[1]};
}

// An output of height x width pixels (at least, for Resize of one size): refused here when it is
// more than an image may have, rather than at the first batch as a request for memory.
void check_output_area(int64_t height, int64_t width) {
  TORCH_CHECK_VALUE(height <= kMaxImagePixels / std::max<int64_t>(width, 1), "an output of at least ", height, " x ",
                    width, " pixels is more than the ", kMaxImagePixels, " an image may have (PIL's limit)");
}

// (height, width) from an int or a 1- or 2-tuple, as torchvision's _setup_size.
std::pair<int64_t, int64_t> to_hw(const SpecValue& v) {
  const auto size = to_ints(v, {1, 2}, "an int or (h, w)");
  check_output_area(size[0], size.back());
  return {size[0], size.back()};
}

template <typename T, typename F>
std::optional<T> optional_arg(const SpecArgs& args, const std::string& name, F convert) {
  const auto it = args.find(name);
  if (it == args.end() || it->second.kind == SpecValue::Kind::kNone) return std::nullopt;
  return convert(it->second);
}

// Only bilinear, the default: InterpolationMode.BILINEAR under any module prefix, or PIL's 2.
void check_bilinear(const SpecArgs& args) {
  const auto it = args.find("interpolation");
  if (it == args.end()) return;
  const SpecValue& v = it->second;
  const bool bilinear = (v.kind == SpecValue::Kind::kInt && v.integer == 2) ||
                        (v.kind == SpecValue::Kind::kName &&
                         (v.string == "BILINEAR" || (v.string.size() > 9 && v.string.compare(v.string.size() - 9, 9, ".BILINEAR") == 0))) ||
                        (v.kind == SpecValue::Kind::kString && v.string == "bilinear");
  TORCH_CHECK_VALUE(bilinear, "interpolation '", v.text, "' is not supported; only InterpolationMode.BILINEAR is");
}

}  // namespace

const std::map<std::string, SpecEntry>& registry() {
  static const std::map<std::string, SpecEntry> entries = {
      {"Resize",
       {{"size", "interpolation", "max_size", "antialias"}, 1,
        [](const SpecArgs& a) {
          check_bilinear(a);
          const auto size = to_ints(a.at("size"), {1, 2}, "an int or (h, w)");
          check_output_area(size[0], size.back());  // one size: the shorter side, so at least size x size
          return std::make_shared<Resize>(size,
                                          optional_arg<int64_t>(a, "max_size", to_int),
                                          optional_arg<bool>(a, "antialias", to_bool));
        }}},
      {"CenterCrop",
       {{"size"}, 1,
        [](const SpecArgs& a) {
          const auto [h, w] = to_hw(a.at("size"));
          return std::make_shared<CenterCrop>(h, w);
        }}},
      {"RandomResizedCrop",
       {{"size", "scale", "ratio", "interpolation", "antialias"}, 1,
        [](const SpecArgs& a) {
          check_bilinear(a);
          const auto [h, w] = to_hw(a.at("size"));
          return std::make_shared<RandomResizedCrop>(
              h, w, optional_arg<std::pair<double, double>>(a, "scale", to_range).value_or(std::pair{0.08, 1.0}),
              optional_arg<std::pair<double, double>>(a, "ratio", to_range).value_or(std::pair{3.0 / 4.0, 4.0 / 3.0}),
              optional_arg<bool>(a, "antialias", to_bool));
        }}},
      {"RandomCrop",
       {{"size", "padding", "pad_if_needed", "fill", "padding_mode"}, 1,
        [](const SpecArgs& a) {
          const auto [h, w] = to_hw(a.at("size"));
          const auto padding = [](const SpecValue& v) { return to_ints(v, {1, 2, 4}, "an int or a 2 or 4-tuple"); };
          const auto fill = [](const SpecValue& v) { return to_ints(v, {1, 3}, "an int or an (r, g, b) tuple"); };
          const auto mode = [](const SpecValue& v) {
            if (v.kind != SpecValue::Kind::kString) bad_value(v, "a quoted string");
            return v.string;
          };
          return std::make_shared<RandomCrop>(h, w, optional_arg<std::vector<int64_t>>(a, "padding", padding).value_or(std::vector<int64_t>{}),
                                              optional_arg<bool>(a, "pad_if_needed", to_bool).value_or(false),
                                              optional_arg<std::vector<int64_t>>(a, "fill", fill).value_or(std::vector<int64_t>{0}),
                                              optional_arg<std::string>(a, "padding_mode", mode).value_or("constant"));
        }}},
      {"RandomHorizontalFlip",
       {{"p"}, 0,
        [](const SpecArgs& a) {
          return std::make_shared<RandomHorizontalFlip>(optional_arg<double>(a, "p", to_float).value_or(0.5));
        }}},
      {"Grayscale",
       {{"num_output_channels"}, 0,
        [](const SpecArgs& a) {
          return std::make_shared<Grayscale>(optional_arg<int64_t>(a, "num_output_channels", to_int).value_or(1));
        }}},
      {"ToTensor", {{}, 0, [](const SpecArgs&) { return std::make_shared<ToTensor>(); }}},
      // inplace changes nothing in the result, only whether torchvision overwrites its input.
      {"Normalize",
       {{"mean", "std", "inplace"}, 2,
        [](const SpecArgs& a) {
          optional_arg<bool>(a, "inplace", to_bool);
          return std::make_shared<Normalize>(to_floats(a.at("mean"), "a number or a tuple of numbers"),
                                             to_floats(a.at("std"), "a number or a tuple of numbers"));
        }}},
  };
  return entries;
}

std::string known_transforms() {
  std::string s;
  for (const auto& [name, entry] : registry()) s += (s.empty() ? "" : ", ") + name;
  return s;
}

std::string signature(const std::string& name, const SpecEntry& entry) {
  std::string s = name + "(";
  for (size_t i = 0; i < entry.params.size(); ++i) s += (i > 0 ? ", " : "") + entry.params[i];
  return s + ")";
}

}  // namespace lockstep::data::spec
