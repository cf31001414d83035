#include "lockstep/core/torch_load.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

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

TEST(TorchLoad, ReadsTorchPickleSaveAndRefusesGarbage) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("t", torch::ones({2}));
  const c10::IValue v = torch_load(torch::pickle_save(d));
  EXPECT_TRUE(torch::equal(v.toGenericDict().at("t").toTensor(), torch::ones({2})));
  EXPECT_NE(testing::error_message([] { torch_load({'n', 'o', 'p', 'e'}); }), "<no error>");
}

}  // namespace
}  // namespace lockstep
