// The hostile-input surfaces of issue 53 that read data: transform specs and CSV tables. See
// targets.h.
#include <torch/torch.h>

#include <cctype>
#include <optional>

#include "lockstep/data/csv.h"
#include "lockstep/data/transforms.h"
#include "targets.h"

namespace lockstep::fuzz {

void transform_spec_input(const uint8_t* data, size_t size) {
  const std::string spec(reinterpret_cast<const char*>(data), size);
  std::optional<data::Transforms> transforms;
  try {
    transforms = data::Transforms::parse(spec);
  } catch (const c10::ValueError& e) {
    const std::string message = e.what_without_backtrace();
    if (message.find("transform spec '") == std::string::npos)
      throw Violation("a refused spec's error does not quote the spec: " + message);
    if (message.size() > 4096) throw Violation("a refused spec's error is " + std::to_string(message.size()) + " bytes");
    return;
  }
  // What parses reads back as itself ("Compose(" + steps + ")"), and runs on an image or refuses it
  // with a c10::Error.
  const std::string canonical = transforms->str();
  if (data::Transforms::parse(canonical.substr(8, canonical.size() - 9)).str() != canonical)
    throw Violation("spec '" + spec + "' reads back as another spec than '" + canonical + "'");
  // A legal but huge output (Resize(10000): 1.2e8 pixels) takes seconds under the sanitizers;
  // outputs are bounded by the image limit, which the transforms' own tests check. Specs with a
  // number above 1024 are parsed, not run.
  int64_t number = 0;  // the run of digits up to here
  for (const char c : spec) {
    number = std::isdigit(static_cast<unsigned char>(c)) ? number * 10 + (c - '0') : 0;
    if (number > 1024) return;
  }
  data::SampleRandom random(0, 0, 0);
  try {
    (void)(*transforms)(torch::full({20, 24, 3}, 100, torch::kUInt8), random);
  } catch (const c10::Error&) {
  }
}

void csv_input(const uint8_t* data, size_t size) {
  const std::string path = write_input("table.csv", data, size);
  expect_clean_outcome(path, [&] {
    const data::CsvTable t = data::read_csv(path, "label");
    const int64_t n = t.labels.size(0);
    if (t.features.size(0) != n || t.features.size(1) != static_cast<int64_t>(t.feature_names.size()) ||
        !torch::isfinite(t.features).all().item<bool>() || t.labels.min().item<int64_t>() < 0 ||
        t.labels.max().item<int64_t>() >= static_cast<int64_t>(t.classes.size()) ||
        static_cast<int64_t>(t.classes.size()) > data::kMaxCsvClasses)
      throw Violation("'" + path + "' gave an inconsistent table: " + std::to_string(n) + " rows, features " +
                      c10::str(t.features.sizes()) + ", " + std::to_string(t.classes.size()) + " classes");
  });
}

}  // namespace lockstep::fuzz
