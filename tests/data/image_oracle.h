#pragma once
// The files and torchvision results tests/python/image_oracle.py writes, made once per build
// (python_fixture) and shared by the image and transform tests.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>

#include "../python_script.h"
#include "lockstep/core/atomic_file.h"

namespace lockstep::testing {

class ImageOracle {
 public:
  // Null when there is no Python with torchvision (the caller skips); fails the test when the
  // script fails.
  static const ImageOracle* get() {
    static const std::unique_ptr<ImageOracle> oracle = make();
    return oracle.get();
  }
  std::string path(const std::string& file) const { return dir_ + "/" + file; }
  torch::Tensor at(const std::string& key) const {
    const auto values = values_.toGenericDict();
    EXPECT_TRUE(values.contains(key)) << key << " is not in oracle.pt";
    return values.contains(key) ? values.at(key).toTensor() : torch::Tensor();
  }

 private:
  static std::unique_ptr<ImageOracle> make() {
    if (run_command(python_with_torch() + " -c 'import torchvision'").exit_code != 0) return nullptr;
    auto oracle = std::make_unique<ImageOracle>();
    const PythonFixture made = python_fixture("image_oracle.py");
    EXPECT_TRUE(made.error.empty()) << made.error;
    if (!made.error.empty()) return nullptr;
    oracle->dir_ = made.dir;
    oracle->values_ = torch::pickle_load(read_file(oracle->path("oracle.pt")));
    return oracle;
  }
  std::string dir_;
  c10::IValue values_;  // the dict oracle.pt holds
};

// The largest absolute difference between two uint8 or float tensors of the same shape.
inline double max_difference(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes() || a.numel() == 0) return a.sizes() == b.sizes() ? 0 : 1e9;
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

}  // namespace lockstep::testing

#define LOCKSTEP_IMAGE_ORACLE_OR_SKIP(name)                                          \
  const ::lockstep::testing::ImageOracle* name = ::lockstep::testing::ImageOracle::get(); \
  if (name == nullptr) GTEST_SKIP() << "the venv's python cannot import torchvision (scripts/bootstrap --test)"
