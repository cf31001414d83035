// Triton's own load tool, perf_analyzer (from tritonclient 2.51.0's wheel: requirements-perf-analyzer.txt),
// driving `lockstep serve` over HTTP and gRPC as a Triton user measures a server: it reads the
// model's metadata and config, sends random inputs of the model's shape at a fixed concurrency, and
// takes the server's side of each request (queue, compute) from the statistics extension.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <sstream>

#include "serve_process.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Where scripts/bootstrap --test puts it: beside the venv's Python, in a folder of its own.
std::filesystem::path perf_analyzer_dir() {
  return std::filesystem::path(LOCKSTEP_PYTHON).parent_path().parent_path() / "perf-analyzer";
}

// One row of perf_analyzer's CSV (-f): its columns by name.
std::map<std::string, std::string> csv_row(const std::string& text, const std::string& concurrency) {
  std::istringstream lines(text);
  std::string header, line;
  std::getline(lines, header);
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    std::stringstream cells(s);
    for (std::string cell; std::getline(cells, cell, ',');) out.push_back(cell);
    return out;
  };
  const std::vector<std::string> names = split(header);
  while (std::getline(lines, line)) {
    const std::vector<std::string> cells = split(line);
    if (cells.empty() || cells[0] != concurrency) continue;
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < names.size() && i < cells.size(); ++i) row[names[i]] = cells[i];
    return row;
  }
  return {};
}

class PerfAnalyzer : public testing::ConvnetWeightsTest, public ::testing::WithParamInterface<std::string> {};

// At concurrency 1 and 4: every request answered (perf_analyzer stops at the first error, e.g. a
// parameter the server refuses), a throughput and latencies measured, and the server's own counts
// read back through the statistics extension. Before: over gRPC every call was refused for the
// triton_enable_empty_final_response parameter Triton's clients set.
TEST_P(PerfAnalyzer, LoadsTheServerAndReadsItsStatistics) {
  const std::string protocol = GetParam();
  const std::filesystem::path dir = perf_analyzer_dir();
  if (!std::filesystem::exists(dir / "bin/perf_analyzer"))
    GTEST_SKIP() << "perf_analyzer is not installed in " << dir << " (scripts/bootstrap --test)";
  testing::TempDir scratch;
  testing::ServeProcess server({"--model", "convnet", "--weights", weights(), "--threads", "1"}, scratch / "log");
  ASSERT_TRUE(server.wait_ready()) << server.log();
  const std::string tool = "LD_LIBRARY_PATH=" + (dir / "nvidia/cuda_runtime/lib").string() + " timeout 120 " +
                           (dir / "bin/perf_analyzer").string();
  const std::string version = testing::run_command(tool + " --version 2>&1").output;
  const std::string target = protocol == "grpc" ? server.grpc_target() : "127.0.0.1:" + std::to_string(server.port());
  const std::string csv = scratch / "result.csv";
  // Short windows, and stability loose enough for a loaded 2-core machine: this is a check that the
  // tool works against the server, not a measurement (bench/ has those).
  const auto r = testing::run_command(
      tool + " -m convnet -u " + target + " -i " + protocol +
      " --concurrency-range 1:4:3 --measurement-interval 500 --stability-percentage 100 --max-trials 10 -f " + csv +
      " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output << server.log();
  EXPECT_THAT(r.output, Not(HasSubstr("error")));
  const std::string csv_text = testing::read_text(csv);
  for (const std::string concurrency : {"1", "4"}) {
    const auto row = csv_row(csv_text, concurrency);
    ASSERT_FALSE(row.empty()) << "no row for concurrency " << concurrency << " in\n" << csv_text;
    EXPECT_GT(std::stod(row.at("Inferences/Second")), 0.0) << concurrency;
    EXPECT_GT(std::stod(row.at("p99 latency")), 0.0) << concurrency;
    EXPECT_GT(std::stod(row.at("Server Compute Infer")), 0.0) << concurrency;  // from the statistics extension
    std::cout << "[ measured ] " << version.substr(0, version.find('\n')) << ", " << protocol << " concurrency "
              << concurrency << ": " << row.at("Inferences/Second") << " infer/s, p99 " << row.at("p99 latency")
              << " us\n";
  }
  // The server's side of the last window, as perf_analyzer computed it from the statistics.
  const std::regex server_count(R"(Server:\s*\n\s*Inference count: (\d+))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, server_count)) << r.output;
  EXPECT_GT(std::stoll(m[1]), 0);
}

INSTANTIATE_TEST_SUITE_P(Protocols, PerfAnalyzer, ::testing::Values("http", "grpc"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace lockstep
