#include "lockstep/core/torch_load.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"

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
// malformed at byte 2. Ints of any width up to int64 are read; protocol 4 is refused naming it and
// the fix (See Note [Integers and protocols LibTorch's unpickler does not read]).
TEST(TorchLoad, ReadsPythonsIntsOfEveryWidthAndNamesProtocolFour) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  testing::TempDir dir;
  const auto r = testing::run_command(
      python + " -c \"import torch, sys; d = {'tokens_seen': 5_000_000_000, 'neg': -5_000_000_000, 'big': 2**62,"
               " 'small_neg': -(2**31) - 1, 'max': 2**63 - 1, 'min': -(2**63), 'three': 2**23 * 300, 'w': torch.ones(2)};"
               " torch.save(d, sys.argv[1] + '/p2.pt'); torch.save(d, sys.argv[1] + '/p4.pt', pickle_protocol=4);"
               " torch.save({'huge': 2**70}, sys.argv[1] + '/huge.pt')\" '" + dir.path() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto d = torch_load(read_file(dir / "p2.pt")).toGenericDict();
  EXPECT_EQ(d.at("tokens_seen").toInt(), 5'000'000'000);
  EXPECT_EQ(d.at("neg").toInt(), -5'000'000'000);
  EXPECT_EQ(d.at("big").toInt(), int64_t{1} << 62);
  EXPECT_EQ(d.at("small_neg").toInt(), -(int64_t{1} << 31) - 1);
  EXPECT_EQ(d.at("max").toInt(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(d.at("min").toInt(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(d.at("three").toInt(), int64_t{300} << 23);
  EXPECT_TRUE(torch::equal(d.at("w").toTensor(), torch::ones({2})));
  EXPECT_THAT(testing::error_message([&] { torch_load(read_file(dir / "p4.pt")); }),
              ::testing::HasSubstr("is pickle protocol 4 (torch.save(..., pickle_protocol=4)), which LibTorch's "
                                   "unpickler does not read; save it with torch.save's default, protocol 2"));
  EXPECT_THAT(testing::error_message([&] { torch_load(read_file(dir / "huge.pt")); }),
              ::testing::HasSubstr("holds an integer of 9 bytes, beyond int64"));
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
