// A version's instances share one module (Note [Intra-op threads of instances]): the weights are
// in memory once however many instances serve them, and instances running side by side on the
// shared module answer as one module does.
#include <gtest/gtest.h>
#include <malloc.h>
#include <torch/torch.h>

#include <future>
#include <iostream>

#include "../test_util.h"
#include "lockstep/infer/predictor.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/zoo.h"
#include "lockstep/serve/model_config.h"
#include "lockstep/serve/model_repository.h"
#include "lockstep/train/memory_limit.h"

namespace lockstep {
namespace {

// Four instances of resnet18 (44.7 MB of fp32 weights and buffers) grow the process by about one
// copy of them. Before, each instance loaded its own: 4 copies, and a 1 GB model served by four
// instances held 4 GB (issue 53 item 9). The bound, two copies, leaves one for the load's own
// transient buffers and the zero-input check's activations.
TEST(ModelRepository, TheInstancesOfAVersionShareOneCopyOfTheWeights) {
  testing::TempDir dir;
  const std::string file = dir / "resnet18.pt";
  torch::manual_seed(7);
  auto model = models::make_model("resnet18", 10);
  models::save_state_dict(*model, file);
  int64_t weights = 0;
  for (const auto& t : model->parameters()) weights += t.numel() * t.element_size();
  for (const auto& t : model->buffers()) weights += t.numel() * t.element_size();

  malloc_trim(0);
  const int64_t before = train::resident_bytes();
  const auto repo = serve::ModelRepository::single(serve::default_model_config("resnet18", 4), file,
                                                   serve::RepositoryOptions().threads(4));
  malloc_trim(0);
  const int64_t grown = train::resident_bytes() - before;
  std::cout << "[ measured ] 4 instances of " << weights / 1e6 << " MB of weights grew the process by "
            << grown / 1e6 << " MB\n";
  EXPECT_LT(grown, 2 * weights);

  // Every instance busy at once: 16 requests of 1-4 samples, each equal to one module's answer.
  infer::Predictor reference{torch::nn::AnyModule(model)};
  model->eval();
  serve::Batcher& batcher = *repo->find("resnet18")->versions.at(0).batcher;
  std::vector<torch::Tensor> inputs;
  std::vector<std::future<serve::Tensors>> answers;
  for (int64_t i = 0; i < 16; ++i) {
    inputs.push_back(torch::randn({1 + i % 4, 3, 32, 32}));
    answers.push_back(batcher.submit({inputs.back()}));
  }
  for (size_t i = 0; i < answers.size(); ++i) {
    const serve::Tensors out = answers[i].get();
    ASSERT_EQ(out.size(), 1u);
    // The same kernels on the same rows, batched with others or not: float32 rounding only.
    EXPECT_TRUE(torch::allclose(out[0], reference.forward(inputs[i]), 1e-4, 1e-5)) << "request " << i;
  }
  repo->stop();
}

}  // namespace
}  // namespace lockstep
