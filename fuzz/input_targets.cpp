// The readers of files people write or edit by hand: tokenizer.json, a --log-jsonl run log, a bench
// matrix. See targets.h.
#include <filesystem>

#include "lockstep/bench/matrix.h"
#include "lockstep/data/tokenizer.h"
#include "lockstep/log/html_report.h"
#include "targets.h"

namespace lockstep::fuzz {

void tokenizer_json_input(const uint8_t* data, size_t size) {
  const std::string path = write_input("tokenizer.json", data, size);
  expect_clean_outcome(path, [&] {
    const data::Tokenizer tokenizer = data::Tokenizer::load(path);
    // What loads must work: encode and decode text, and write a file that reads back the same.
    const std::vector<int64_t> ids = tokenizer.encode("Hello, world! 12 \xc3\xa9t\xc3\xa9 <pad>\n\tend");
    for (const int64_t id : ids)
      if (id < 0 || id >= tokenizer.size())
        throw Violation("'" + path + "' encoded to id " + std::to_string(id) + " of a tokenizer of size " +
                        std::to_string(tokenizer.size()));
    (void)tokenizer.decode(ids);
    const std::string json = tokenizer.to_json();
    if (data::Tokenizer::from_json(json, path).to_json() != json)
      throw Violation("'" + path + "' does not read back as it was written");
  });
}

void run_log_input(const uint8_t* data, size_t size) {
  const std::string path = write_input("run.jsonl", data, size);
  expect_clean_outcome(path, [&] {
    // As `lockstep report` does: read the log, draw the page.
    const log::RunRecord run = log::read_run_log(path);
    (void)log::report_html(run, std::filesystem::path(path).filename().string(), std::nullopt);
  });
}

void bench_matrix_input(const uint8_t* data, size_t size) {
  const std::string path = write_input("matrix.yaml", data, size);
  expect_clean_outcome(path, [&] {
    for (const bench::BenchConfig& c : bench::read_matrix(path, 2))
      if (c.key.empty() || c.world_size < 1 || c.threads < 1 || c.accum_steps < 1)
        throw Violation("'" + path + "' gave configuration '" + c.key + "' with world_size " +
                        std::to_string(c.world_size) + ", threads " + std::to_string(c.threads) + ", accum_steps " +
                        std::to_string(c.accum_steps));
  });
}

}  // namespace lockstep::fuzz
