// Loading state dicts: files Python wrote with torch.save, and files that are not state dicts.
#include "lockstep/models/state_dict.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fstream>
#include <iostream>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/models/zoo.h"

namespace lockstep::models {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// What the README documents for --init-weights: torch.save(model.state_dict(), path), an
// OrderedDict with a _metadata attribute. LibTorch's own unpickler failed on it with
// "isGenericDict() INTERNAL ASSERT FAILED ... Expected GenericDict but got None".
// See Note [OrderedDict in LibTorch's unpickler].
TEST(StateDict, LoadsARealPythonStateDictValueForValue) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  testing::TempDir dir;
  for (const std::string name : {"convnet", "mlp"}) {
    const std::string path = dir / (name + ".pt");
    auto r = testing::run_command("cd " LOCKSTEP_SOURCE_DIR "/tests/python && " + python +
                                  " save_state_dict.py " + name + " " + path);
    ASSERT_EQ(r.exit_code, 0) << r.output.substr(0, 2000);
    const auto j = nlohmann::json::parse(testing::last_json_line(r.output));

    auto model = make_model(name);
    load_state_dict_file(*model, path);
    size_t compared = 0;
    for (const auto& [key, tensor] : state_dict(*model)) {
      ASSERT_TRUE(j["values"].contains(key)) << key;
      const auto expected = j["values"][key].get<std::vector<double>>();
      const torch::Tensor ours = tensor.to(torch::kDouble).flatten().contiguous();
      ASSERT_EQ(ours.numel(), static_cast<int64_t>(expected.size())) << key;
      // float32 values went through double in JSON unchanged: equal bit for bit.
      EXPECT_TRUE(torch::equal(ours, torch::tensor(expected, torch::kDouble))) << key;
      ++compared;
    }
    EXPECT_EQ(compared, j["values"].size());

    model->eval();
    const auto shape = input_shape(name);
    torch::Tensor x = torch::linspace(-1, 1, 2 * shape[0] * shape[1] * shape[2]).reshape({2, shape[0], shape[1], shape[2]});
    torch::NoGradGuard no_grad;
    torch::Tensor ours = model->forward(x).flatten();
    torch::Tensor theirs = torch::tensor(j["logits"].get<std::vector<float>>());
    EXPECT_LE((ours - theirs).abs().max().item<double>(), 1e-4) << name;
  }
}

// `--init-weights /tmp` gave "basic_filebuf::underflow".
TEST(StateDict, DirectoryIsNamedAsADirectory) {
  testing::TempDir dir;
  auto model = make_model("mlp");
  EXPECT_EQ(testing::error_message([&] { load_state_dict_file(*model, dir.path()); }),
            "cannot read '" + dir.path() + "': it is a directory, not a file; give the path of a file");
}

// Bit flips in the pickle gave bare "vector::_M_range_check ..." (a std::out_of_range, not even a
// c10::Error) or "Unknown type name 'DictKstr'", naming no file, and some crashed LibTorch's
// unpickler (SIGSEGV). Every single-byte corruption of a saved state dict must either load or
// fail with a c10::Error naming the file and the fix.
TEST(StateDict, EveryCorruptByteIsReportedWithTheFileName) {
  testing::TempDir dir;
  torch::nn::Linear small(2, 3);
  save_state_dict(*small, dir / "good.pt");
  const std::vector<char> good = read_file(dir / "good.pt");
  // The pickle: from PROTO 2 after the data.pkl entry's name to the next zip header.
  const std::string text(good.begin(), good.end());
  const size_t name = text.find("data.pkl");
  ASSERT_NE(name, std::string::npos);
  const size_t begin = text.find("\x80\x02", name);
  const size_t end = text.find("PK\x03\x04", begin);
  ASSERT_NE(begin, std::string::npos);
  ASSERT_NE(end, std::string::npos);
  const std::string path = dir / "bad.pt";
  int failures = 0;
  std::string example;
  for (size_t i = begin; i < end; ++i) {
    for (const unsigned char flip : {0x01, 0xFF}) {
      std::vector<char> bad = good;
      bad[i] = static_cast<char>(static_cast<unsigned char>(bad[i]) ^ flip);
      write_file_atomic(path, bad);
      torch::nn::Linear target(2, 3);
      try {
        load_state_dict_file(*target, path);
      } catch (const c10::Error& e) {
        const std::string msg = e.what_without_backtrace();
        EXPECT_THAT(msg, HasSubstr("'" + path + "'")) << "byte " << i << " ^ " << int(flip);
        ++failures;
        if (msg.rfind("cannot load a state dict", 0) == 0) example = msg;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "byte " << i << " ^ " << int(flip) << ": " << typeid(e).name() << ": " << e.what();
      }
    }
  }
  EXPECT_GT(failures, static_cast<int>(end - begin));
  std::cout << "bytes " << begin << " to " << end << ", " << failures << " failures; e.g.: " << example << "\n";
  EXPECT_THAT(example, StartsWith("cannot load a state dict from '" + path + "': the file is corrupt"));
  EXPECT_THAT(example, HasSubstr("give a file written by torch.save(model.state_dict(), PATH)"));
}

}  // namespace
}  // namespace lockstep::models
