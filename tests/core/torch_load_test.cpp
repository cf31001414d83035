#include "lockstep/core/torch_load.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/process.h"
#include "lockstep/models/state_dict.h"

namespace lockstep {
namespace {

// What torch::pickle_load cannot read and Python writes all the time: a model's OrderedDict state
// dict (with _metadata), one-entry dicts and one-element lists, nested, memoized and shared.
TEST(TorchLoad, ReadsPythonsOrderedDictsAndOneEntryContainers) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  testing::TempDir dir;
  const auto r = testing::run_command(
      python + " -c \"import torch, sys; torch.manual_seed(0); m = torch.nn.Linear(3, 2);"
               " torch.nn.init.constant_(m.weight, 0.5); torch.nn.init.constant_(m.bias, -1.0);"
               " shared = {'k': 2.5};"
               " torch.save({'model': m.state_dict(), 'one': {'a': 1}, 'list': [torch.arange(3.0)],"
               " 'nested': [shared, shared], 'empty': {}}, sys.argv[1])\" '" + (dir / "py.pt") + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const c10::IValue v = torch_load(read_file(dir / "py.pt"));
  ASSERT_TRUE(v.isGenericDict()) << v.tagKind();
  const auto top = v.toGenericDict();
  const auto model = top.at("model").toGenericDict();
  ASSERT_EQ(model.size(), 2u);  // weight and bias; _metadata is not an entry
  EXPECT_TRUE(torch::equal(model.at("weight").toTensor(), torch::full({2, 3}, 0.5)));
  EXPECT_TRUE(torch::equal(model.at("bias").toTensor(), torch::full({2}, -1.0)));
  EXPECT_EQ(top.at("one").toGenericDict().at("a").toInt(), 1);
  ASSERT_EQ(top.at("list").toListRef().size(), 1u);
  EXPECT_TRUE(torch::equal(top.at("list").toListRef()[0].toTensor(), torch::arange(3.0)));
  ASSERT_EQ(top.at("nested").toListRef().size(), 2u);
  EXPECT_EQ(top.at("nested").toListRef()[1].toGenericDict().at("k").toDouble(), 2.5);
  EXPECT_EQ(top.at("empty").toGenericDict().size(), 0u);
}

// Issue 53 item 19: an int between 2^31 and 2^55 anywhere in the pickle ("tokens_seen":
// 5_000_000_000) failed with "Expected length to be 8, got 5", and pickle_protocol=4 was called
// malformed at byte 2. Ints of any width up to int64 are read, in every protocol (See Note
// [Integers LibTorch's unpickler does not read] and Note [Pickle protocols 3, 4 and 5]).
TEST(TorchLoad, ReadsPythonsIntsOfEveryWidthInEveryProtocol) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  testing::TempDir dir;
  const auto r = testing::run_command(
      python + " -c \"import torch, sys; d = {'tokens_seen': 5_000_000_000, 'neg': -5_000_000_000, 'big': 2**62,"
               " 'small_neg': -(2**31) - 1, 'max': 2**63 - 1, 'min': -(2**63), 'three': 2**23 * 300, 'w': torch.ones(2)};"
               " [torch.save(d, sys.argv[1] + f'/p{p}.pt', pickle_protocol=p) for p in (2, 3, 4, 5)];"
               " torch.save({'huge': 2**70}, sys.argv[1] + '/huge.pt', pickle_protocol=4)\" '" + dir.path() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string file : {"p2.pt", "p3.pt", "p4.pt", "p5.pt"}) {
    SCOPED_TRACE(file);
    const auto d = torch_load(read_file(dir / file)).toGenericDict();
    EXPECT_EQ(d.at("tokens_seen").toInt(), 5'000'000'000);
    EXPECT_EQ(d.at("neg").toInt(), -5'000'000'000);
    EXPECT_EQ(d.at("big").toInt(), int64_t{1} << 62);
    EXPECT_EQ(d.at("small_neg").toInt(), -(int64_t{1} << 31) - 1);
    EXPECT_EQ(d.at("max").toInt(), std::numeric_limits<int64_t>::max());
    EXPECT_EQ(d.at("min").toInt(), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(d.at("three").toInt(), int64_t{300} << 23);
    EXPECT_TRUE(torch::equal(d.at("w").toTensor(), torch::ones({2})));
  }
  EXPECT_THAT(testing::error_message([&] { torch_load(read_file(dir / "huge.pt")); }),
              ::testing::HasSubstr("its pickle (data.pkl, protocol 4) holds an integer of 9 bytes, beyond int64"));
}

// Issue 53 item 9: a 1.7 MB weights file whose data/0 record inflates to 1 GB was accepted: only
// "claimed <= record" was checked, after the record was read. Each storage record must hold
// exactly the bytes its storage needs, checked from the zip's directory before anything is read
// (See Note [Storage sizes come from the pickle]). Files from Python, their records edited and the
// archives rewritten by Python's zipfile.
TEST(TorchLoad, ARecordOfAnotherSizeThanItsStorageIsRefusedBeforeItIsRead) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  testing::TempDir dir;
  const auto r = testing::run_command(
      python + " -c \"import sys, zipfile, torch\n"
               "d = sys.argv[1]\n"
               "torch.save(torch.nn.Linear(2, 3).state_dict(), d + '/w.pt')\n"  // data/0: 6 floats, 24 bytes
               "torch.save({'e': torch.zeros(0), 'w': torch.ones(2)}, d + '/e.pt')\n"  // data/0: no bytes
               "def edit(src, dst, change, method=zipfile.ZIP_STORED):\n"
               "    z = zipfile.ZipFile(d + '/' + src)\n"
               "    with zipfile.ZipFile(d + '/' + dst, 'w') as out:\n"
               "        for i in z.infolist():\n"
               "            last = i.filename.endswith('/data/0')\n"
               "            data = change(z.read(i)) if last else z.read(i)\n"
               "            out.writestr(i.filename, data, compress_type=method if last else zipfile.ZIP_STORED)\n"
               "edit('w.pt', 'padded.pt', lambda b: b + bytes(8))\n"
               "edit('w.pt', 'cut.pt', lambda b: b[:-4])\n"
               "edit('w.pt', 'inflates.pt', lambda b: b + bytes(60 << 20), zipfile.ZIP_DEFLATED)\n"
               "edit('e.pt', 'empty_padded.pt', lambda b: b + bytes(16))\n"
               "\" '" + dir.path() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto refusal = [&](const std::string& file) {
    return testing::error_message([&] { torch_load(read_file(dir / file)); });
  };
  const std::string fix = "; torch.save writes a storage's record with exactly its bytes (6 elements of "
                          "torch.FloatStorage here), so the file was cut, padded or edited: save it again";
  EXPECT_THAT(refusal("padded.pt"), ::testing::AllOf(::testing::HasSubstr("its pickle claims 24 bytes for the storage "
                                                                           "in record data/0, which holds 32 bytes"),
                                                      ::testing::HasSubstr(fix)));
  EXPECT_THAT(refusal("cut.pt"), ::testing::HasSubstr("claims 24 bytes for the storage in record data/0, which holds "
                                                      "20 bytes" + fix));
  const double before = peak_rss_mib();
  EXPECT_THAT(refusal("inflates.pt"), ::testing::HasSubstr("claims 24 bytes for the storage in record data/0, which "
                                                           "holds 62914584 bytes"));
  EXPECT_LT(peak_rss_mib() - before, 30.0);  // the 60 MiB were never inflated
  EXPECT_THAT(refusal("empty_padded.pt"), ::testing::HasSubstr("claims 0 bytes for the storage in record data/0, "
                                                               "which holds 16 bytes; torch.save writes a storage's "
                                                               "record with exactly its bytes (0 elements of"));
  // A caller names the file; the files as Python wrote them load.
  torch::nn::Linear linear(2, 3);
  EXPECT_THAT(testing::error_message([&] { models::load_state_dict_file(*linear, dir / "padded.pt"); }),
              ::testing::AllOf(::testing::HasSubstr("'" + (dir / "padded.pt") + "'"),
                               ::testing::HasSubstr("which holds 32 bytes")));
  EXPECT_NO_THROW(models::load_state_dict_file(*linear, dir / "w.pt"));
  EXPECT_EQ(torch_load(read_file(dir / "e.pt")).toGenericDict().at("e").toTensor().numel(), 0);
}

TEST(TorchLoad, ReadsTorchPickleSaveAndRefusesGarbage) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("t", torch::ones({2}));
  const c10::IValue v = torch_load(torch::pickle_save(d));
  EXPECT_TRUE(torch::equal(v.toGenericDict().at("t").toTensor(), torch::ones({2})));
  EXPECT_NE(testing::error_message([] { torch_load({'n', 'o', 'p', 'e'}); }), "<no error>");
}

}  // namespace
}  // namespace lockstep
