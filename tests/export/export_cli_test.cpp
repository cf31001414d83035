// `lockstep export` as a user meets it: the files it accepts, the metadata it writes, and its
// errors on bad input, after which nothing is left at --out (a file already there is untouched).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "lockstep/core/atomic_file.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/zoo.h"
#include "lockstep/train/checkpoint.h"
#include "onnx_check.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

const std::string kCli = LOCKSTEP_CLI;

TEST(ExportCli, WritesACheckedModelWithItsMetadata) {
  testing::TempDir dir;
  models::save_state_dict(*models::make_model("convnet"), dir / "w.pt");
  const auto r = testing::run_command(kCli + " export --model convnet --weights " + (dir / "w.pt") + " --out " +
                                      (dir / "m.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("exported convnet"));
  const auto proto = testing::read_onnx(dir / "m.onnx");
  EXPECT_EQ(testing::metadata(proto, "model"), "convnet");
  EXPECT_EQ(testing::metadata(proto, "weights"), "w.pt");
  EXPECT_EQ(testing::metadata(proto, "weights_kind"), "state_dict");
  EXPECT_EQ(proto.graph().output(0).name(), "logits");
  // Nothing but the file: the temporary file of the atomic write is gone.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 2);
}

// A bf16 run's checkpoint: the export says what run produced the weights, and that it is fp32.
TEST(ExportCli, ExportsFromACheckpointWithTheRunsSettingsInTheMetadata) {
  testing::TempDir dir;
  auto r = testing::run_command(kCli + " train --quiet --model mlp --data synthetic --limit 200 --batch-size 50"
                                       " --precision bf16 --seed 5 --checkpoint-dir " + (dir / "ckpt"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The epoch's end: 200 samples / 50 = 4 steps (the directory also holds the run's .lock).
  const std::string checkpoint = train::latest_checkpoint(dir / "ckpt").value_or("");
  ASSERT_THAT(checkpoint, HasSubstr("step-00000004.pt")) << r.output;
  r = testing::run_command(kCli + " export --model mlp --weights " + checkpoint + " --out " + (dir / "m.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("from checkpoint"));
  const auto proto = testing::read_onnx(dir / "m.onnx");
  EXPECT_EQ(testing::metadata(proto, "weights_kind"), "checkpoint");
  EXPECT_EQ(testing::metadata(proto, "run.model"), "mlp");
  EXPECT_EQ(testing::metadata(proto, "run.precision"), "bf16");
  EXPECT_EQ(testing::metadata(proto, "run.seed"), "5");
  EXPECT_EQ(testing::metadata(proto, "run.world_size"), "1");
  EXPECT_EQ(testing::metadata(proto, "position.step"), "4");
  EXPECT_EQ(testing::metadata(proto, "exported_precision"), "fp32 (trained in bf16)");
  for (const auto& init : proto.graph().initializer()) EXPECT_EQ(init.data_type(), onnx::TensorProto::FLOAT);

  // A checkpoint of the mlp is refused for the convnet, naming the model it holds.
  r = testing::run_command(kCli + " export --model convnet --weights " + checkpoint + " --out " + (dir / "c.onnx"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("is a checkpoint of a 'mlp', not of a 'convnet'; pass --model mlp"));
  EXPECT_FALSE(fs::exists(dir / "c.onnx"));
}

struct BadExport {
  std::string name;
  std::string model;
  std::function<std::string(const testing::TempDir&)> weights;  // makes the weights file, returns its path
  std::function<std::string(const testing::TempDir&)> out;
  std::string message;
};

void PrintTo(const BadExport& b, std::ostream* os) { *os << b.name; }

std::string good_convnet(const testing::TempDir& dir) {
  models::save_state_dict(*models::make_model("convnet"), dir / "convnet.pt");
  return dir / "convnet.pt";
}

std::string out_in(const testing::TempDir& dir) { return dir / "model.onnx"; }

class ExportCliRejects : public ::testing::TestWithParam<BadExport> {};

TEST_P(ExportCliRejects, WithAClearErrorAndNothingWrittenAtOut) {
  const BadExport& b = GetParam();
  testing::TempDir dir;
  const std::string weights = b.weights(dir), out = b.out(dir);
  const auto r = testing::run_command(kCli + " export --model " + b.model + " --weights " + weights + " --out " + out);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(b.message));
  EXPECT_THAT(r.output, Not(HasSubstr("Exception raised from")));  // no C++ backtrace
  EXPECT_FALSE(fs::exists(out) && fs::is_regular_file(out)) << out;
  // Neither a finished file nor the atomic write's temporary file is left in the directory.
  for (const auto& e : fs::directory_iterator(dir.path()))
    if (e.is_regular_file()) EXPECT_EQ(e.path().extension(), ".pt") << e.path();
}

INSTANTIATE_TEST_SUITE_P(
    BadInputs, ExportCliRejects,
    ::testing::Values(
        BadExport{"missing_weights", "convnet", [](const auto& d) { return d / "nope.pt"; }, out_in, "nope.pt"},
        BadExport{"corrupt_weights", "convnet",
                  [](const auto& d) {
                    write_file_atomic(d / "junk.pt", std::vector<char>(4096, 'x'));
                    return d / "junk.pt";
                  },
                  out_in, "the file is corrupt or not a PyTorch file"},
        BadExport{"truncated_weights", "convnet",
                  [](const auto& d) {
                    const std::string path = good_convnet(d);
                    auto bytes = read_file(path);
                    bytes.resize(bytes.size() / 2);
                    write_file_atomic(path, bytes);
                    return path;
                  },
                  out_in, "corrupt"},
        BadExport{"another_models_weights", "resnet18",
                  [](const auto& d) { return good_convnet(d); }, out_in,
                  "holds the weights of a 'convnet', not of a 'resnet18'; pass --model convnet"},
        BadExport{"out_in_a_missing_directory", "convnet", good_convnet,
                  [](const auto& d) { return d / "no/such/dir/model.onnx"; }, "cannot create files in"},
        BadExport{"out_is_a_directory", "convnet", good_convnet,
                  [](const auto& d) {
                    fs::create_directory(d / "adir");
                    return d / "adir";
                  },
                  "is a directory"}),
    [](const auto& info) { return info.param.name; });

// A failed export leaves a file already at --out exactly as it was.
TEST(ExportCli, AFailedExportLeavesTheFileAtOutUntouched) {
  testing::TempDir dir;
  write_file_atomic(dir / "model.onnx", {'o', 'l', 'd'});
  write_file_atomic(dir / "junk.pt", std::vector<char>(100, 'x'));
  const auto r = testing::run_command(kCli + " export --model mlp --weights " + (dir / "junk.pt") + " --out " +
                                      (dir / "model.onnx"));
  EXPECT_NE(r.exit_code, 0);
  const auto bytes = read_file(dir / "model.onnx");
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "old");
}

}  // namespace
}  // namespace lockstep
