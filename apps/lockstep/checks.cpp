#include "checks.h"

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

}  // namespace lockstep::cli
