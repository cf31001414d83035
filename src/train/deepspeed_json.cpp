// DeepSpeed JSON files read with the lines of their keys, and the types of the sections lockstep
// reads checked: see deepspeed_reader.h and Note [DeepSpeed configs].
#include <c10/util/Exception.h>

#include <algorithm>
#include <string>
#include <vector>

#include "deepspeed_reader.h"

namespace lockstep::train::deepspeed {
namespace {

// DeepSpeed configs nest four levels at most; deeper nesting is refused while parsing.
constexpr size_t kMaxJsonDepth = 100;

// `s` as a message shows it: at most `most` bytes.
std::string clipped(const std::string& s, size_t most = 80) {
  return s.size() <= most ? s : s.substr(0, most) + "... (" + std::to_string(s.size()) + " bytes)";
}

// A value as an error shows it: scalars as written (long strings cut), containers by their kind.
std::string shown(const json& v) {
  return v.is_object() ? "an object" : v.is_array() ? "an array" : clipped(v.dump());
}


// The JSON text of `path` as a config, refusing a key given twice in one object (DeepSpeed refuses
// it; Python's json alone keeps the last), a number beyond a double, nesting deeper than
// kMaxJsonDepth. Errors name the file, the key and the line.
class JsonFileParser {
 public:
  JsonFileParser(std::string path, std::string text) : path_(std::move(path)), text_(std::move(text)) {}

  json parse() {
    std::stringbuf buf(text_);
    std::istream in(&buf);
    // The lexer reads one character at a time: the buffer's position is where it stands.
    const auto position = [&buf] { return static_cast<size_t>(buf.pubseekoff(0, std::ios::cur, std::ios::in)); };
    try {
      return json::parse(
          in, [&](int, json::parse_event_t event, json& parsed) { return on_event(event, parsed, position()); },
          /*allow_exceptions=*/true, /*ignore_comments=*/true);
    } catch (const json::parse_error& e) {
      TORCH_CHECK_VALUE(false, path_, " is not valid JSON: ", clipped(e.what(), 300));
    } catch (const json::exception& e) {  // out_of_range 406: a number beyond a double, such as 1e400
      const size_t at = position();       // just past the number and the character after it
      const std::string what = e.what();  // "[json.exception.out_of_range.406] number overflow ..."
      TORCH_CHECK_VALUE(false, path_, ", line ", line_at(at == 0 ? 0 : at - 1), ": ", key_path(), ": ",
                        clipped(what.substr(what.find("] ") + 2), 300),
                        ", beyond a double's range (about 1.8e308); give a finite number");
    }
    return json();
  }
  const KeyLines& lines() const { return lines_; }

 private:
  struct Level {
    explicit Level(bool is_object) : object(is_object) {}
    bool object;
    std::string key;                       // an object's current key
    int64_t index = 0;                     // an array's current item
    std::map<std::string, int64_t> lines;  // an object's keys by their lines
  };

  bool on_event(json::parse_event_t event, const json& parsed, size_t at) {
    using Event = json::parse_event_t;
    if (event == Event::object_start || event == Event::array_start) {
      TORCH_CHECK_VALUE(levels_.size() < kMaxJsonDepth, path_, ", line ", line_at(at), ": ", key_path(),
                        " nests more than ", kMaxJsonDepth, " levels deep; a DeepSpeed config nests a few");
      levels_.emplace_back(event == Event::object_start);
    } else if (event == Event::key) {
      Level& top = levels_.back();
      top.key = parsed.get<std::string>();
      const int64_t line = line_at(at);  // the lexer stands just past the key's closing quote
      const auto [first, fresh] = top.lines.emplace(top.key, line);
      TORCH_CHECK_VALUE(fresh, path_, ", line ", line, ": ", key_path(), " is given twice (lines ", first->second,
                        " and ", line, "); DeepSpeed refuses duplicate keys too: delete one of them");
      lines_.emplace(key_path(), line);
    } else if (event == Event::object_end || event == Event::array_end) {
      levels_.pop_back();
    }
    // An array's item is complete: the next one is its next index.
    if ((event == Event::value || event == Event::object_end || event == Event::array_end) && !levels_.empty() &&
        !levels_.back().object)
      ++levels_.back().index;
    return true;
  }

  // "optimizer.params.betas[1]": where the parser stands (at most 200 bytes).
  std::string key_path() const {
    std::string out;
    for (const Level& level : levels_) {
      if (level.object) {
        if (!out.empty()) out += '.';
        out += clipped(level.key);
      } else {
        out += '[' + std::to_string(level.index) + ']';
      }
      if (out.size() > 200) return clipped(out, 200);
    }
    return out.empty() ? "the top level" : out;
  }
  // The line of byte `at`; the lexer moves forward, so each byte is counted about once.
  int64_t line_at(size_t at) {
    for (at = std::min(at, text_.size()); counted_ < at; ++counted_) newlines_ += text_[counted_] == '\n';
    for (; counted_ > at; --counted_) newlines_ -= text_[counted_ - 1] == '\n';
    return newlines_ + 1;
  }

  std::string path_;
  std::string text_;
  std::vector<Level> levels_;
  KeyLines lines_;
  size_t counted_ = 0;   // bytes of text_ whose newlines are counted
  int64_t newlines_ = 0;
};

enum class Shape { kSection, kBoolean, kString };
struct KeyShape {
  const char* key;  // dotted: a section's own keys follow it
  Shape shape;
  const char* example;
};
// The sections lockstep reads and the values it reads without a type check of their own: of the
// wrong type, each would be skipped silently (and DeepSpeed fails on it, or reads it otherwise).
// A section may be null (absent).
const std::vector<KeyShape> kKeyShapes{
    {"zero_optimization", Shape::kSection, R"({"stage": 2})"},
    {"zero_optimization.offload_optimizer", Shape::kSection, R"({"device": "cpu"})"},
    {"zero_optimization.offload_param", Shape::kSection, R"({"device": "cpu"})"},
    {"bf16", Shape::kSection, R"({"enabled": true})"},
    {"bfloat16", Shape::kSection, R"({"enabled": true})"},
    {"fp16", Shape::kSection, R"({"enabled": true, "loss_scale": 0})"},
    {"amp", Shape::kSection, R"({"enabled": true, "opt_level": "O1"})"},
    {"amp.opt_level", Shape::kString, R"("O1")"},
    {"optimizer", Shape::kSection, R"({"type": "AdamW", "params": {"lr": 0.001}})"},
    {"optimizer.params", Shape::kSection, R"({"lr": 0.001})"},
    {"optimizer.params.adam_w_mode", Shape::kBoolean, "true"},
    {"optimizer.params.amsgrad", Shape::kBoolean, "false"},
    {"optimizer.params.bias_correction", Shape::kBoolean, "true"},
    {"scheduler", Shape::kSection, R"({"type": "WarmupLR", "params": {"warmup_num_steps": 100}})"},
    {"scheduler.params", Shape::kSection, R"({"warmup_num_steps": 100})"},
    {"scheduler.params.warmup_type", Shape::kString, R"("linear")"},
    {"tensorboard", Shape::kSection, R"({"enabled": true, "output_path": "runs"})"},
    {"tensorboard.enabled", Shape::kBoolean, "true"},
    {"tensorboard.output_path", Shape::kString, R"("runs")"},
    {"tensorboard.job_name", Shape::kString, R"("my_job")"},
};

}  // namespace

// "ds.json, line 3" where the key's line is known, else "ds.json".
std::string where(const std::string& source, const KeyLines& lines, const std::string& key) {
  const auto it = lines.find(key);
  return it == lines.end() ? source : source + ", line " + std::to_string(it->second);
}

json parse_config_file(const std::string& path, std::string text, KeyLines& lines) {
  JsonFileParser parser(path, std::move(text));
  json config = parser.parse();
  lines = parser.lines();
  return config;
}

// A known key of the wrong type is an error, strict or not. See Note [DeepSpeed configs].
void check_shapes(const json& config, const std::string& source, const KeyLines& lines) {
  for (const KeyShape& k : kKeyShapes) {
    const std::string key = k.key;
    const json* v = &config;
    for (size_t begin = 0; v != nullptr && begin <= key.size();) {
      const size_t end = std::min(key.find('.', begin), key.size());
      const std::string part = key.substr(begin, end - begin);
      v = v->is_object() && v->contains(part) ? &(*v)[part] : nullptr;
      begin = end + 1;
    }
    if (v == nullptr) continue;  // absent, or its section is not an object (reported before it)
    // DeepSpeed still reads zero_optimization's old boolean form (true: stage 1); so does read_zero.
    const bool fits = key == "zero_optimization" && v->is_boolean() ? true
                      : k.shape == Shape::kSection ? v->is_object() || v->is_null()
                      : k.shape == Shape::kBoolean ? v->is_boolean()
                                                   : v->is_string();
    TORCH_CHECK_VALUE(fits, where(source, lines, key), ": ", key, " is ", shown(*v), "; ",
                      k.shape == Shape::kSection ? "it is a section: write it as an object such as "
                      : k.shape == Shape::kBoolean ? "give true or false, such as "
                                                   : "give a string such as ",
                      k.example, " (strict or not: skipped, it would train something else)");
  }
}

}  // namespace lockstep::train::deepspeed
