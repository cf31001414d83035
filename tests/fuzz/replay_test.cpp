// The fuzz corpora as regression tests: every seed, every input libFuzzer kept and every crash it
// found (fuzz/crashes/<target>/) runs through the same entry function as `make fuzz`, here built
// with gcc and without sanitizers. See docs/fuzzing.md.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "../../fuzz/targets.h"
#include "lockstep/core/atomic_file.h"

namespace lockstep::fuzz {
namespace {

namespace fs = std::filesystem;
using Entry = void (*)(const uint8_t*, size_t);

// libFuzzer's -timeout in `make fuzz`: an input slower than this is reported there as a hang.
constexpr auto kHangLimit = std::chrono::seconds(10);

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

void replay(const std::string& target, Entry entry) {
  const fs::path fuzz_dir = fs::path(LOCKSTEP_SOURCE_DIR) / "fuzz";
  std::vector<fs::path> inputs = files_in(fuzz_dir / "corpus" / target);
  ASSERT_FALSE(inputs.empty()) << "no seed corpus in " << (fuzz_dir / "corpus" / target);
  const std::vector<fs::path> crashes = files_in(fuzz_dir / "crashes" / target);
  inputs.insert(inputs.end(), crashes.begin(), crashes.end());
  for (const fs::path& input : inputs) {
    const std::vector<char> bytes = read_file(input.string());
    const auto start = std::chrono::steady_clock::now();
    try {
      entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const Violation& v) {
      ADD_FAILURE() << input << ": " << v.what();
    } catch (const std::exception& e) {  // the target could not even run (temporary files)
      ADD_FAILURE() << input << ": the fuzz target failed: " << e.what();
    }
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_LT(took, kHangLimit) << input << " took "
                                << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                                << " ms: libFuzzer would report a hang";
  }
}

TEST(FuzzReplay, IdxReaderCorpusAndCrashes) { replay("idx", idx_input); }
TEST(FuzzReplay, StateDictLoaderCorpusAndCrashes) { replay("state_dict", state_dict_input); }
TEST(FuzzReplay, CheckpointLoaderCorpusAndCrashes) { replay("checkpoint", checkpoint_input); }
TEST(FuzzReplay, TensorBoardRoundTripCorpusAndCrashes) { replay("tfevents_round_trip", tfevents_round_trip_input); }
TEST(FuzzReplay, TensorBoardReaderCorpusAndCrashes) { replay("tfevents_reader", tfevents_reader_input); }
TEST(FuzzReplay, ZipChecksumCorpusAndCrashes) { replay("zip_checksum", zip_checksum_input); }
TEST(FuzzReplay, HttpRequestParserCorpusAndCrashes) { replay("http_request", http_request_input); }
TEST(FuzzReplay, ModelConfigCorpusAndCrashes) { replay("model_config", model_config_input); }
TEST(FuzzReplay, TokenizerJsonCorpusAndCrashes) { replay("tokenizer_json", tokenizer_json_input); }
TEST(FuzzReplay, RunLogCorpusAndCrashes) { replay("run_log", run_log_input); }
TEST(FuzzReplay, BenchMatrixCorpusAndCrashes) { replay("bench_matrix", bench_matrix_input); }
TEST(FuzzReplay, TransformSpecCorpusAndCrashes) { replay("transform_spec", transform_spec_input); }
TEST(FuzzReplay, CsvCorpusAndCrashes) { replay("csv", csv_input); }
TEST(FuzzReplay, AccelerateConfigCorpusAndCrashes) { replay("accelerate_config", accelerate_config_input); }
TEST(FuzzReplay, DeepSpeedConfigCorpusAndCrashes) { replay("deepspeed_config", deepspeed_config_input); }

// The oracle the targets share: an error is clean only when it names the file.
TEST(FuzzReplay, AnErrorThatDoesNotNameTheFileIsAViolation) {
  const std::string path = "/tmp/x/model.pt";
  EXPECT_THROW(expect_clean_outcome(path, [] { throw std::out_of_range("vector::_M_range_check: __n (which is 5)"); }),
               Violation);
  EXPECT_THROW(expect_clean_outcome(path, [] { TORCH_CHECK(false, "Unknown type name 'DictKstr'"); }), Violation);
  EXPECT_NO_THROW(expect_clean_outcome(path, [&] { TORCH_CHECK(false, "'", path, "' is corrupt"); }));
  EXPECT_NO_THROW(expect_clean_outcome(path, [] {}));
}

}  // namespace
}  // namespace lockstep::fuzz
