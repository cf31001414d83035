#pragma once
// Helpers of the export tests: the two independent checkers (ONNX Runtime through Node, Python's
// onnx checker) and reading an exported file back.

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <torch/torch.h>

#include <fstream>
#include <string>

#include "../test_util.h"

namespace lockstep::testing {

inline const std::string kExportTestDir = LOCKSTEP_SOURCE_DIR "/tests/export";

// Why ONNX Runtime (the venv's onnxruntime) cannot run here, or "" when it can.
inline std::string onnxruntime_missing() {
  const auto r = run_command(std::string(LOCKSTEP_PYTHON) + " -c 'import onnxruntime'");
  return r.exit_code == 0 ? "" : "onnxruntime is not installed in the venv (scripts/bootstrap --test): " + r.output;
}

// Python's onnx checker on `path` with full_check; "" when it passes, else its output.
inline std::string python_onnx_check(const std::string& path) {
  const auto r = run_command(std::string(LOCKSTEP_PYTHON) + " -c 'import sys, onnx; onnx.checker.check_model(onnx.load(sys.argv[1]), "
                             "full_check=True); print(\"onnx checker: ok\")' " + path);
  return r.exit_code == 0 && r.output.find("onnx checker: ok") != std::string::npos ? "" : r.output;
}

inline bool python_onnx_available() { return run_command(std::string(LOCKSTEP_PYTHON) + " -c 'import onnx'").exit_code == 0; }

inline void write_floats(const std::string& path, const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kFloat).contiguous();
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
}

// Runs `model_path` in ONNX Runtime on `input`; returns its output shaped (B, rest...) as
// `expected_shape`, or fails the test.
inline torch::Tensor run_in_onnxruntime(const std::string& model_path, const torch::Tensor& input,
                                        const std::string& scratch_dir) {
  const std::string in = scratch_dir + "/ort_input.bin", out = scratch_dir + "/ort_output.bin";
  write_floats(in, input);
  std::string dims;
  for (int64_t d : input.sizes()) dims += (dims.empty() ? "" : ",") + std::to_string(d);
  const auto r = run_command(std::string(LOCKSTEP_PYTHON) + " " + kExportTestDir + "/run_onnx.py " + model_path + " " + in + " " + dims + " " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return {};
  std::ifstream f(out, std::ios::binary | std::ios::ate);
  const auto bytes = static_cast<int64_t>(f.tellg());
  f.seekg(0);
  torch::Tensor t = torch::empty({bytes / 4}, torch::kFloat);
  f.read(static_cast<char*>(t.data_ptr()), bytes);
  return t.reshape({input.size(0), -1});
}

inline onnx::ModelProto read_onnx(const std::string& path) {
  onnx::ModelProto proto;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(proto.ParseFromIstream(&in)) << path;
  return proto;
}

inline std::string metadata(const onnx::ModelProto& proto, const std::string& key) {
  for (const auto& p : proto.metadata_props())
    if (p.key() == key) return p.value();
  return "<absent>";
}

}  // namespace lockstep::testing
