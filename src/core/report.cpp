#include "lockstep/core/report.h"

#include <cstdio>

namespace lockstep {

Reporter stdio_reporter() {
  return [](ReportKind kind, const std::string& line) {
    static constexpr const char* kPrefix[] = {"", "lockstep: ", "lockstep: warning: ", "lockstep: error: "};
    std::FILE* out = kind == ReportKind::kInfo ? stdout : stderr;
    std::fprintf(out, "%s%s\n", kPrefix[static_cast<int>(kind)], line.c_str());
    std::fflush(out);
  };
}

}  // namespace lockstep
