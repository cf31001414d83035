#include "checks.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>

namespace lockstep::cli {
namespace {

CLI::Validator real_at_least(double low, bool strict, const char* name) {
  return CLI::Validator(
      [low, strict](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0') return "'" + text + "' is not a number";
        if (!std::isfinite(v) || errno == ERANGE) return "'" + text + "' is not a finite number";
        std::ostringstream bound;
        bound << (strict ? "> " : ">= ") << low;
        if (strict ? v <= low : v < low) return "'" + text + "' must be " + bound.str();
        return "";
      },
      name, name);
}

CLI::Validator count_at_least(long long low, const char* name) {
  return CLI::Validator(
      [low](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0') return "'" + text + "' is not a whole number";
        if (errno == ERANGE) return "'" + text + "' is too large: the most is 9223372036854775807";
        if (v < low) return "'" + text + "' must be at least " + std::to_string(low);
        return "";
      },
      name, name);
}

}  // namespace

CLI::Validator non_negative_number() { return real_at_least(0.0, false, "NONNEGATIVE"); }
CLI::Validator positive_number() { return real_at_least(0.0, true, "POSITIVE"); }
CLI::Validator non_negative_count() { return count_at_least(0, "NONNEGATIVE"); }
CLI::Validator positive_count() { return count_at_least(1, "POSITIVE"); }

std::string with_flag_names(const std::string& message, const CLI::App& cmd,
                            const std::vector<std::pair<std::string, std::string>>& wording) {
  const auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::string out = message;
  for (const auto& [library, command] : wording)
    for (size_t at = out.find(library); at != std::string::npos; at = out.find(library, at + command.size()))
      out.replace(at, library.size(), command);
  for (const CLI::Option* option : cmd.get_options()) {
    for (const std::string& name : option->get_lnames()) {
      if (name.find('-') == std::string::npos) continue;
      std::string field = name;
      std::replace(field.begin(), field.end(), '-', '_');
      for (size_t at = out.find(field); at != std::string::npos; at = out.find(field, at + 1)) {
        const size_t end = at + field.size();
        if ((at > 0 && word_char(out[at - 1])) || (end < out.size() && word_char(out[end]))) continue;
        out.replace(at, field.size(), "--" + name);
      }
    }
  }
  return out;
}

}  // namespace lockstep::cli
