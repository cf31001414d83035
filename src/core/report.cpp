#include "lockstep/core/report.h"

#include <c10/util/Exception.h>

#include <cstdio>

namespace lockstep {

Reporter stdio_reporter(const std::string& program) {
  return [program](ReportKind kind, const std::string& line) {
    static constexpr const char* kLabel[] = {"", "", "warning: ", "error: "};
    std::FILE* out = kind == ReportKind::kInfo ? stdout : stderr;
    const std::string prefix = kind == ReportKind::kInfo ? "" : program + ": " + kLabel[static_cast<int>(kind)];
    std::fprintf(out, "%s%s\n", prefix.c_str(), line.c_str());
    std::fflush(out);
  };
}

std::string error_text(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
}

}  // namespace lockstep
