// Found by reasoning about the state_dict fuzz target and reproduced under its ASan build: a
// torch.save archive whose pickle nests 200,000 lists overflowed the stack inside LibTorch. See
// Note [Pickle nesting depth].

#include <caffe2/serialize/inline_container.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../test_util.h"
#include "lockstep/core/torch_load.h"

namespace lockstep {
namespace {

// A zip archive as torch.save writes it around a pickle of `depth` nested empty lists:
// PROTO 2, EMPTY_LIST, (MARK EMPTY_LIST) x (depth-1), APPENDS x (depth-1), STOP.
std::vector<char> nested_lists(size_t depth) {
  std::string pickle = "\x80\x02]";
  for (size_t i = 1; i < depth; ++i) pickle += "(]";
  pickle += std::string(depth - 1, 'e') + ".";
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    archive.insert(archive.end(), static_cast<const char*>(data), static_cast<const char*>(data) + n);
    return n;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  writer.writeEndOfFile();
  return archive;
}

// A million levels (issue 53 asks every recursive parser to be tested there): 3 MB of pickle.
TEST(PickleNesting, ADeeplyNestedPickleIsRefusedInsteadOfOverflowingTheStack) {
  EXPECT_THAT(testing::error_message([] { torch_load(nested_lists(1000000)); }),
              ::testing::HasSubstr("nests containers more than 1000 deep"));
  EXPECT_THAT(testing::error_message([] { torch_load(nested_lists(1001)); }),
              ::testing::HasSubstr("nests containers more than 1000 deep"));
  // Up to the limit it loads: a list holding a list ... 1000 levels in all.
  c10::IValue v = torch_load(nested_lists(1000));
  size_t levels = 1;
  while (!v.toListRef().empty()) {
    v = c10::IValue(v.toListRef()[0]);
    ++levels;
  }
  EXPECT_EQ(levels, 1000u);
}

}  // namespace
}  // namespace lockstep
