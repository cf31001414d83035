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

#include "lockstep/data/transforms.h"
#include "transform_format.h"
#include "transform_spec_internal.h"

namespace lockstep::data {
namespace {

using spec::kMaxSpecInteger;
using spec::known_transforms;
using spec::registry;
using spec::signature;
using spec::SpecArgs;
using spec::SpecEntry;
using spec::SpecValue;

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
