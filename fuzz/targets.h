#pragma once

// The fuzz targets' entry functions. Each runs one input through a real lockstep entry point and
// judges the outcome: an input must be accepted, or rejected by a c10::Error / std::exception
// whose message names the file it came from. Anything else throws Violation.
// Two drivers call them: fuzz/fuzzer_main.cpp (libFuzzer, built with clang and sanitizers by
// `make fuzz`) and tests/fuzz/replay_test.cpp (the gcc test suite replays every corpus file and
// every saved crash). See docs/fuzzing.md.

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

namespace lockstep::fuzz {

// A defect an input exposed: an error that does not name the file, or a round trip that changed
// a value. Deliberately not a library error type, so no `catch (const c10::Error&)` hides it.
class Violation : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Throws Violation when a rejection's message does not name `path`.
void expect_names_file(const std::string& message, const std::string& path);

// Runs `load` on the input file `path`: returns when it succeeds or throws an error naming `path`.
template <typename F>
void expect_clean_outcome(const std::string& path, F&& load) {
  try {
    load();
  } catch (const Violation&) {
    throw;
  } catch (const c10::Error& e) {
    expect_names_file(e.what_without_backtrace(), path);
  } catch (const std::exception& e) {
    expect_names_file(e.what(), path);
  }
}

// `name` in a per-process temporary directory (removed at exit).
std::string input_path(const std::string& name);
// input_path(name), written with `size` bytes.
std::string write_input(const std::string& name, const uint8_t* data, size_t size);

// data::read_idx. The first byte picks the encoding: odd gzips the rest before writing (so the
// fuzzer explores IDX headers behind the gzip layer), even writes the rest as it is (plain IDX,
// or a gzip stream the fuzzer corrupts).
void idx_input(const uint8_t* data, size_t size);

// models::load_state_dict_file into the reference MLP (784-256-10, as `lockstep train --model mlp`
// saves it); core::torch_load parses the file on the way.
void state_dict_input(const uint8_t* data, size_t size);

// train::load_checkpoint.
void checkpoint_input(const uint8_t* data, size_t size);

// core::verify_zip_checksums on the bytes themselves: the zip walker must reject any damage with
// a c10::Error (its callers add the file's name). The loader targets are built with
// FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, which skips this check so that their inputs reach
// the unpickler behind it; this target covers the check itself.
void zip_checksum_input(const uint8_t* data, size_t size);

// log::SummaryWriter -> log::read_tfevents: the bytes are decoded into scalars (tag, value, step,
// wall time), written, read back, and every field must come back bit for bit.
void tfevents_round_trip_input(const uint8_t* data, size_t size);

// log::read_tfevents on arbitrary bytes: it must reject them cleanly or decode them. The first
// byte picks the layout: even writes the rest as it is (framing and CRCs under test), odd reads it
// as (length byte, payload)... and frames each payload with correct CRCs (the protobuf decoder
// under test).
void tfevents_reader_input(const uint8_t* data, size_t size);

// serve::http::RequestParser on a connection's bytes, read at once and in reads of 1 + (first
// byte % 13) bytes: both must give the same requests and the same refusal (Note [One framing for
// every hop]); no body may pass the limit; nothing may throw.
void http_request_input(const uint8_t* data, size_t size);

// serve::parse_model_config on a config.pbtxt for a model directory named "convnet": accepted
// within the server's bounds, or refused with an error naming the file.
void model_config_input(const uint8_t* data, size_t size);

// data::Tokenizer::load on a tokenizer.json; what loads must encode, decode, and write a file
// that reads back the same.
void tokenizer_json_input(const uint8_t* data, size_t size);

// log::read_run_log on a --log-jsonl file, then log::report_html on what it read (`lockstep report`).
void run_log_input(const uint8_t* data, size_t size);

// bench::read_matrix on a `lockstep bench --matrix` YAML file.
void bench_matrix_input(const uint8_t* data, size_t size);

// data::Transforms::parse on a --transform spec: accepted, or refused with a ValueError quoting the
// spec (a bounded message); what parses must read back as itself from str() and run on an image or
// refuse it with a c10::Error.
void transform_spec_input(const uint8_t* data, size_t size);

// data::read_csv with label column "label": accepted as a consistent table (rows, columns, finite
// features, labels within the classes, at most kMaxCsvClasses), or refused naming the file.
void csv_input(const uint8_t* data, size_t size);

// launch::accelerate_launch_settings on an accelerate config file.
void accelerate_config_input(const uint8_t* data, size_t size);

// train::with_deepspeed_config_file on a DeepSpeed JSON config, for a world of 2.
void deepspeed_config_input(const uint8_t* data, size_t size);

}  // namespace lockstep::fuzz
