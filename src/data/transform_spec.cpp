// Transforms::parse: torchvision transforms written as Python calls, e.g.
//   "T.Resize(32); T.CenterCrop(28), ToTensor, Normalize((0.5,), std=(0.5,))"
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/data/image.h"
#include "lockstep/data/transforms.h"
#include "transform_format.h"

namespace lockstep::data {
namespace {

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

constexpr int64_t kMaxSpecInteger = 65535;

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

// A recursive-descent reader of the spec. Errors are c10::ValueError naming the spec, the
// offset and the text there.
class SpecParser {
  static constexpr int kMaxNesting = 64;
  static constexpr size_t kShownSpec = 200;

  struct DepthGuard {
    explicit DepthGuard(int& d) : depth(d) { ++depth; }
    ~DepthGuard() { --depth; }
    int& depth;
  };

 public:
  explicit SpecParser(const std::string& spec) : spec_(spec) {}

  std::vector<std::shared_ptr<const Transform>> parse() {
    std::vector<std::shared_ptr<const Transform>> steps;
    skip_space();
    while (pos_ < spec_.size()) {
      starts_.push_back(pos_);
      steps.push_back(parse_transform());
      skip_space();
      if (pos_ < spec_.size()) {
        if (spec_[pos_] != ',' && spec_[pos_] != ';') fail("expected ',' or ';' between transforms");
        ++pos_;
        skip_space();
      }
    }
    if (steps.empty()) fail("no transforms");
    return steps;
  }

  // Where the i-th transform starts in the spec.
  size_t start(size_t i) const { return starts_.at(i); }

  [[noreturn]] void fail(const std::string& what, size_t at = std::string::npos) const {
    at = at == std::string::npos ? pos_ : at;
    const std::string here = at < spec_.size() ? "'" + spec_.substr(at, 24) + "'" : "the end";
    // A long spec is shown by its start: the offset says where. What is wrong quotes names and
    // values from the spec, so it is cut too (the transform_spec fuzzer made it 4 kB).
    const std::string shown =
        spec_.size() <= kShownSpec
            ? spec_
            : spec_.substr(0, kShownSpec) + "... (" + std::to_string(spec_.size()) + " characters)";
    const std::string why = what.size() <= 2 * kShownSpec ? what : what.substr(0, 2 * kShownSpec) + "...";
    TORCH_CHECK_VALUE(false, "transform spec '", shown, "': ", why, " at ", here, " (offset ", at,
                      "); known transforms: ", known_transforms());
  }

 private:
  void skip_space() {
    while (pos_ < spec_.size() && std::isspace(static_cast<unsigned char>(spec_[pos_]))) ++pos_;
  }

  bool accept(char c) {
    skip_space();
    if (pos_ < spec_.size() && spec_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  // A dotted name: letters, digits, '_' and '.'.
  std::string name() {
    skip_space();
    const size_t start = pos_;
    while (pos_ < spec_.size() && (std::isalnum(static_cast<unsigned char>(spec_[pos_])) || spec_[pos_] == '_' ||
                                   spec_[pos_] == '.'))
      ++pos_;
    return spec_.substr(start, pos_ - start);
  }

  std::shared_ptr<const Transform> parse_transform() {
    const size_t start = pos_;
    std::string full = name();
    if (full.empty()) fail("expected a transform's name");
    std::string short_name = full;
    for (const std::string prefix : {"torchvision.transforms.", "transforms.", "T."})
      if (full.rfind(prefix, 0) == 0) short_name = full.substr(prefix.size());
    const auto it = registry().find(short_name);
    if (it == registry().end()) fail("unknown transform '" + full + "'", start);
    const SpecEntry& entry = it->second;
    SpecArgs args;
    if (accept('(')) parse_arguments(full, entry, args);
    for (size_t i = 0; i < entry.required; ++i)
      if (!args.count(entry.params[i]))
        fail(full + " needs its argument '" + entry.params[i] + "'; it takes " + signature(full, entry), start);
    try {
      return entry.make(args);
    } catch (const c10::ValueError& e) {
      fail(full + ": " + e.what_without_backtrace(), start);
    }
  }

  void parse_arguments(const std::string& full, const SpecEntry& entry, SpecArgs& args) {
    size_t positional = 0;
    bool keywords = false;
    while (!accept(')')) {
      const size_t start = pos_;
      const size_t before = pos_;
      std::string keyword = name();
      if (!keyword.empty() && keyword.find('.') == std::string::npos && accept('=')) {
        if (std::find(entry.params.begin(), entry.params.end(), keyword) == entry.params.end())
          fail(full + " has no argument '" + keyword + "'; it takes " + signature(full, entry), start);
        keywords = true;
      } else {
        pos_ = before;
        if (keywords) fail("a positional argument after a keyword argument", start);
        if (positional >= entry.params.size())
          fail(full + " takes at most " + std::to_string(entry.params.size()) + " arguments: " + signature(full, entry),
               start);
        keyword = entry.params[positional++];
      }
      if (args.count(keyword)) fail(full + " got argument '" + keyword + "' twice", start);
      args[keyword] = value();
      if (!accept(',')) {
        if (!accept(')')) fail("expected ',' or ')' in the arguments of " + full);
        break;
      }
    }
  }

  SpecValue value() {
    skip_space();
    const size_t start = pos_;
    SpecValue v;
    if (pos_ >= spec_.size()) fail("expected a value");
    const char c = spec_[pos_];
    if (c == '(' || c == '[') {
      // Python refuses 200 levels; no transform takes more than two.
      if (depth_ == kMaxNesting) fail("values nested more than " + std::to_string(kMaxNesting) + " deep");
      const DepthGuard nested(depth_);
      ++pos_;
      const char close = c == '(' ? ')' : ']';
      v.kind = SpecValue::Kind::kTuple;
      bool comma = false;
      while (!accept(close)) {
        v.items.push_back(value());
        comma = accept(',');
        if (!comma && !accept(close)) fail(std::string("expected ',' or '") + close + "'");
        if (!comma) break;
      }
      // (x) is x in Python; (x,) and [x] are sequences.
      // (Moved out first: assigning v from its own item freed the item while it was copied, a
      // use-after-free the transform_spec fuzzer found.)
      if (c == '(' && v.items.size() == 1 && !comma) {
        SpecValue inner = std::move(v.items[0]);
        v = std::move(inner);
      }
    } else if (c == '\'' || c == '"') {
      const size_t end = spec_.find(c, pos_ + 1);
      if (end == std::string::npos) fail("unterminated string");
      v.kind = SpecValue::Kind::kString;
      v.string = spec_.substr(pos_ + 1, end - pos_ - 1);
      pos_ = end + 1;
    } else if (std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+' || c == '.') {
      number(v);
    } else {
      v.string = name();
      if (v.string.empty()) fail("expected a value");
      if (v.string == "None") v.kind = SpecValue::Kind::kNone;
      else if (v.string == "True" || v.string == "False") v = bool_value(v.string == "True");
      else v.kind = SpecValue::Kind::kName;
    }
    v.text = spec_.substr(start, pos_ - start);
    return v;
  }

  static SpecValue bool_value(bool b) {
    SpecValue v;
    v.kind = SpecValue::Kind::kBool;
    v.boolean = b;
    return v;
  }

  // An int, a float (with '.', an exponent), or a quotient of two numbers such as 3/4 or
  // 3.0 / 4.0, as a ratio is often written.
  void number(SpecValue& v) {
    const size_t start = pos_;
    const char* begin = spec_.c_str() + pos_;
    char* end = nullptr;
    const double real = std::strtod(begin, &end);
    if (end == begin) fail("expected a number");
    const std::string token(begin, static_cast<const char*>(end));
    pos_ += token.size();
    const bool is_float = token.find_first_of(".eE") != std::string::npos;
    v.kind = is_float ? SpecValue::Kind::kFloat : SpecValue::Kind::kInt;
    v.real = real;
    if (!is_float) {
      errno = 0;
      v.integer = std::strtoll(token.c_str(), nullptr, 10);
      // No argument of a transform is larger than an image's side (65535 is JPEG's largest).
      if (errno == ERANGE || v.integer > kMaxSpecInteger || v.integer < -kMaxSpecInteger)
        fail("integer " + token + " is larger than any transform takes (at most " + std::to_string(kMaxSpecInteger) +
                 ", the largest side of a JPEG image)",
             start);
    }
    if (accept('/')) {
      skip_space();
      SpecValue divisor;
      number(divisor);
      const double d = divisor.kind == SpecValue::Kind::kInt ? static_cast<double>(divisor.integer) : divisor.real;
      if (d == 0) fail("division by zero", start);
      v.real = (v.kind == SpecValue::Kind::kInt ? static_cast<double>(v.integer) : v.real) / d;
      v.kind = SpecValue::Kind::kFloat;
    }
  }

  const std::string& spec_;
  size_t pos_ = 0;
  int depth_ = 0;  // values open around pos_
  std::vector<size_t> starts_;
};

}  // namespace

Transforms Transforms::parse(const std::string& spec) {
  SpecParser parser(spec);
  Transforms transforms;
  transforms.steps_ = parser.parse();
  // Steps on the uint8 image come before ToTensor, steps on the float tensor after it.
  bool converted = false;
  for (size_t i = 0; i < transforms.steps_.size(); ++i) {
    const auto& step = transforms.steps_[i];
    switch (step->stage()) {
      case TransformStage::kImage:
        if (converted)
          parser.fail(step->str() + " works on the uint8 image and must come before ToTensor()", parser.start(i));
        break;
      case TransformStage::kToTensor:
        if (converted) parser.fail("ToTensor() twice", parser.start(i));
        converted = true;
        break;
      case TransformStage::kTensor:
        if (!converted)
          parser.fail(step->str() + " works on the float tensor and needs ToTensor() before it", parser.start(i));
        break;
    }
  }
  return transforms;
}

}  // namespace lockstep::data
